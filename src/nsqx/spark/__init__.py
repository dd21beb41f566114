"""nsqx.spark: the PySpark data source "nsq" (pyspark >= 4.2, pyarrow).

``spark.dataSource.register(NsqDataSource)`` registers it explicitly; installing nsqx also
makes the ``pyspark_nsq`` module auto-register it. See docs/spark.md.

Importing this package (before the SparkSession starts) points Spark's Python workers at
this Python when the environment names none (``worker_python``).
"""

from __future__ import annotations

import os
import shutil
import sys
import warnings

from nsqx.spark.options import NsqOptionError, NsqOptions

__all__ = ["NsqDataSource", "NsqOptionError", "NsqOptions", "worker_python"]


def worker_python() -> None:
    """Set ``PYSPARK_PYTHON`` (and ``PYSPARK_DRIVER_PYTHON``) to this Python when neither
    is set.

    Spark starts its Python workers (the lookup of ``pyspark_*`` data sources, the
    planner, the readers and writers) with ``PYSPARK_PYTHON``, else ``python3`` from the
    PATH: another Python, without nsqx, when a script runs as ``.venv/bin/python
    script.py`` with the venv not activated (``DATA_SOURCE_NOT_FOUND ... nsq``). The
    driver's JVM copies the environment when the SparkSession starts, so this must run
    before: importing nsqx.spark does it. Imported later, it warns when the workers are
    not this Python. A Python the user chose (either variable) is left alone.
    """
    if os.environ.get("PYSPARK_PYTHON") or os.environ.get("PYSPARK_DRIVER_PYTHON"):
        return
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    if context is None:
        return
    # too late for this session: its JVM and its context chose `python3` from the PATH
    chosen = shutil.which(str(getattr(context, "pythonExec", "python3")))
    if chosen is None or os.path.dirname(chosen) != os.path.dirname(sys.executable):
        warnings.warn(
            f"nsqx.spark was imported after the SparkSession started: Spark's Python "
            f"workers run {chosen or 'python3'}, not {sys.executable}, and may not find "
            "nsqx; import nsqx.spark before creating the session, or set PYSPARK_PYTHON",
            RuntimeWarning,
            stacklevel=2,
        )


worker_python()


def __getattr__(name: str) -> object:
    # pyspark is optional: import the data source only when it is asked for
    if name == "NsqDataSource":
        from nsqx.spark.source import NsqDataSource

        return NsqDataSource
    raise AttributeError(name)
