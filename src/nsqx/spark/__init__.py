"""nsqx.spark: the PySpark data source "nsq" (pyspark >= 4.2, pyarrow).

``spark.dataSource.register(NsqDataSource)`` registers it explicitly; installing nsqx also
makes the ``pyspark_nsq`` module auto-register it. See docs/spark.md.
"""

from nsqx.spark.options import NsqOptionError, NsqOptions

__all__ = ["NsqDataSource", "NsqOptionError", "NsqOptions"]


def __getattr__(name: str) -> object:
    # pyspark is optional: import the data source only when it is asked for
    if name == "NsqDataSource":
        from nsqx.spark.source import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
