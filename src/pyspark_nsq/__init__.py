"""Auto-registration of the "nsq" data source: PySpark registers the ``DefaultSource`` of
any importable top-level ``pyspark_<name>`` module, so ``spark.read.format("nsq")`` works
with nothing more than nsqx installed (``pip install nsqx[spark]``)."""

from nsqx.spark.source import NsqDataSource as DefaultSource

__all__ = ["DefaultSource"]
