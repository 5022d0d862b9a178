"""Build (once per pyspark version and source) and locate the provider's jar.

The provider is plain Java 17 compiled with ``javac`` against the jars of the installed
pyspark (``pyspark/jars/*``): no Maven, nothing else to download. The jar is cached under
``$STATESTORE_CACHE`` (default ``~/.cache/statestore``) as
``spark/<pyspark version>-<source hash>/statestore-spark.jar``; a file lock keeps parallel
builds (several test workers, several drivers) from stepping on each other.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from statestore.core.errors import SparkConnectorError

__all__ = [
    "NEWER_SPARK",
    "PROVIDER_CLASS",
    "SUPPORTED",
    "SparkConnectorError",
    "jar_path",
    "pyspark_home",
    "spark_version",
]

PROVIDER_CLASS = "statestore.spark.RingStateStoreProvider"
SUPPORTED = ((4, 0), (4, 4))  # pyspark >= 4.0, < 4.4 (tested: 4.3.0)
JAVA_SOURCES = Path(__file__).resolve().parent / "java"
# the read-ahead's Spark plan rule and operator (a case class of Spark's plan tree, which
# Java cannot well extend): compiled after the Java sources with the Scala compiler that
# pyspark's jars ship (scala-compiler), against them
SCALA_SOURCES = Path(__file__).resolve().parent / "scala"


def pyspark_home() -> tuple[Path, str]:
    """The installed pyspark's directory and version; a clear error if it is missing or
    outside the supported range."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkConnectorError(
            "pyspark is not installed: pip install 'statestore[spark]' (pyspark>=4.0,<4.4)"
        ) from exc
    version = str(pyspark.__version__)
    try:
        major_minor = spark_version(version)
    except (IndexError, ValueError) as exc:
        raise SparkConnectorError(f"cannot read the pyspark version {version!r}") from exc
    lo, hi = SUPPORTED
    if not lo <= major_minor < hi:
        raise SparkConnectorError(
            f"pyspark {version} is not supported: the ring provider is built for pyspark "
            f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]} (pip install 'pyspark>=4.0,<4.4')"
        )
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "jars").is_dir():
        raise SparkConnectorError(
            f"pyspark at {home} has no jars/ folder: install pyspark from PyPI, not a "
            "client-only build"
        )
    return home, version


# sources built only against a newer Spark: Repartition uses Spark 4.2's offline repartition
# classes (its partition-key extractors and repartition-batch rules); the read-ahead names
# the stateful operators' package of Spark 4.3 (the version it is tested with)
NEWER_SPARK = {"Repartition.java": (4, 2), "ReadAhead.scala": (4, 3)}
# the read-ahead's plan rule, found by Spark's service loader (no spark.sql.extensions set)
EXTENSIONS_SERVICE = "META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider"
EXTENSIONS_CLASS = "statestore.spark.RingExtensions"


def spark_version(version: str) -> tuple[int, int]:
    parts = version.split(".")
    return int(parts[0]), int(parts[1])


def _sources(version: str) -> list[Path]:
    have = spark_version(version)
    files = sorted(
        f for f in JAVA_SOURCES.rglob("*.java") if have >= NEWER_SPARK.get(f.name, (0, 0))
    )
    files += sorted(
        f for f in SCALA_SOURCES.rglob("*.scala") if have >= NEWER_SPARK.get(f.name, (0, 0))
    )
    if not files:
        raise SparkConnectorError(f"the provider's Java sources are missing from {JAVA_SOURCES}")
    return files


def _source_hash(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(f.parents[2])).encode())  # statestore/spark/NAME
        h.update(b"\0")
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def cache_dir() -> Path:
    base = os.environ.get("STATESTORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "statestore"
    )
    return Path(base) / "spark"


def _javac() -> str:
    javac = shutil.which("javac")
    if javac is None:
        home = os.environ.get("JAVA_HOME")
        if home and os.access(os.path.join(home, "bin", "javac"), os.X_OK):
            javac = os.path.join(home, "bin", "javac")
    if javac is None:
        raise SparkConnectorError(
            "javac was not found: the ring provider is compiled on first use and needs a JDK "
            "17 or newer (e.g. apt-get install openjdk-17-jdk-headless, or set JAVA_HOME)"
        )
    return javac


def jar_path(rebuild: bool = False) -> str:
    """The provider jar for the installed pyspark, built on first use."""
    home, version = pyspark_home()
    files = _sources(version)
    target_dir = cache_dir() / f"{version}-{_source_hash(files)}"
    jar = target_dir / "statestore-spark.jar"
    if jar.is_file() and not rebuild:
        return str(jar)
    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if jar.is_file() and not rebuild:
            return str(jar)
        _compile(_javac(), home, files, jar)
    return str(jar)


def compile_java(javac: str, classpath: str, files: list[Path], classes: Path, what: str) -> None:
    """Compile ``files`` (Java 17) against ``classpath`` into ``classes``; a
    SparkConnectorError with javac's message, naming ``what`` was compiled, if that fails.
    The provider's build, and the test harness's (tests/javakit.py) against its jar."""
    cmd = [javac, "--release", "17", "-nowarn", "-Xlint:-options", "-encoding", "UTF-8"]
    cmd += ["-cp", classpath, "-d", str(classes), *map(str, files)]
    out = _run_compiler(cmd, what)
    if "invalid target release" in out or "release version 17 not supported" in out:
        raise SparkConnectorError(
            f"{javac} is older than Java 17: install a JDK 17+ (Spark 4 needs it too)"
        )
    if out:
        raise _failed(what, out)


def compile_scala(javac: str, home: Path, files: list[Path], classes: Path) -> None:
    """Compile ``files`` (Scala) with pyspark's own Scala compiler against its jars and
    ``classes`` (the Java just compiled) into ``classes``; a SparkConnectorError with the
    compiler's message if that fails."""
    if not files:
        return
    java = str(Path(javac).with_name("java"))
    cmd = [java, "-cp", str(home / "jars" / "*"), "scala.tools.nsc.Main", "-usejavacp"]
    cmd += ["-nowarn", "-classpath", str(classes), "-d", str(classes), *map(str, files)]
    out = _run_compiler(cmd, "the provider's Scala")
    if out:
        raise _failed("the provider's Scala", out)


def _run_compiler(cmd: list[str], what: str) -> str:
    """Run a compiler: "" when it succeeded, else what it said."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
    except OSError as exc:
        raise SparkConnectorError(f"could not run {cmd[0]} for {what}: {exc}") from exc
    if done.returncode == 0:
        return ""
    return (done.stderr or done.stdout).strip() or f"{cmd[0]} exited with {done.returncode}"


def _failed(what: str, out: str) -> SparkConnectorError:
    return SparkConnectorError(
        f"compiling {what} against pyspark's jars failed (is this pyspark supported?):\n"
        f"{out[-3000:]}"
    )


def _compile(javac: str, home: Path, files: list[Path], jar: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="statestore-javac-") as tmp:
        classes = Path(tmp) / "classes"
        classes.mkdir()
        java = [f for f in files if f.suffix == ".java"]
        scala = [f for f in files if f.suffix == ".scala"]
        compile_java(javac, str(home / "jars" / "*"), java, classes, "the ring provider")
        compile_scala(javac, home, scala, classes)
        partial = jar.with_suffix(".jar.part")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: statestore\n")
            if scala:  # the read-ahead's rule, for Spark's service loader
                zf.writestr(EXTENSIONS_SERVICE, EXTENSIONS_CLASS + "\n")
            for f in sorted(classes.rglob("*.class")):
                zf.write(f, str(f.relative_to(classes)))
        os.replace(partial, jar)
