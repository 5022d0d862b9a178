"""The Java codec harness run from Python: ``CodecHarness`` (msgpack in, msgpack out) in a JVM
with the provider's jar, for the differential tests that hold Java to Python byte for byte
(tests/ring/test_java_codec.py, tests/ring/test_hostile_input.py).

The harness is a test tool, not part of the provider: its source is
tests/java/statestore/spark/CodecHarness.java, compiled here against the provider's jar (in
the provider's package, for the package-private classes it drives) into the jar's cache,
once per jar and harness source."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

Harness = Callable[[str, list[Any]], list[Any]]

HARNESS_SOURCES = Path(__file__).resolve().parent / "java"
HARNESS_CLASS = "statestore.spark.CodecHarness"


def _java_tools() -> tuple[str, str] | str:
    """(javac, java), or why they cannot be used."""
    javac, java = shutil.which("javac"), shutil.which("java")
    home = os.environ.get("JAVA_HOME")
    if home:
        javac = javac or _exe(Path(home) / "bin" / "javac")
        java = java or _exe(Path(home) / "bin" / "java")
    if javac is None:
        return "javac (JDK 17+) is not installed: the Java codec cannot be compiled"
    if java is None:
        return "java is not installed: the Java codec cannot be run"
    return javac, java


def _exe(p: Path) -> str | None:
    return str(p) if os.access(p, os.X_OK) else None


def harness_classpath(javac: str = "javac") -> str:
    """The classpath that runs ``CodecHarness``: the harness's classes (compiled against the
    provider's jar on first use), the jar, pyspark's jars. Raises SparkConnectorError when
    the jar or the harness does not build."""
    import spark_connector._build as build

    home, _ = build.pyspark_home()
    jar = build.jar_path()
    jars = str(home / "jars" / "*")
    files = sorted(HARNESS_SOURCES.rglob("*.java"))
    h = hashlib.sha256(jar.encode())
    for f in files:
        h.update(b"\0" + str(f.relative_to(HARNESS_SOURCES)).encode() + b"\0" + f.read_bytes())
    target = Path(jar).parent / f"harness-{h.hexdigest()[:12]}"
    classes = target / "classes"
    if not (target / "done").is_file():
        target.mkdir(parents=True, exist_ok=True)
        with open(target / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (target / "done").is_file():
                shutil.rmtree(classes, ignore_errors=True)
                classes.mkdir()
                cp = f"{jar}{os.pathsep}{jars}"
                build.compile_java(javac, cp, files, classes, "the codec harness")
                (target / "done").write_text("")
    return os.pathsep.join((str(classes), jar, jars))


def harness_at(work: Path) -> Harness:
    """The CodecHarness runner, its files in ``work``; skips (saying why) without a JDK or
    pyspark, and fails when the provider does not compile (a broken build must not pass as
    a skip)."""
    tools = _java_tools()
    if isinstance(tools, str):
        pytest.skip(tools)
    javac, java = tools
    import spark_connector._build as build

    try:
        build.pyspark_home()
    except build.SparkConnectorError as exc:
        pytest.skip(f"the provider jar cannot be built here: {exc}")
    classpath = harness_classpath(javac)  # a compile error fails the test with javac's message

    def run(command: str, cases: list[Any]) -> list[Any]:
        src, dst = work / f"{command}.in", work / f"{command}.out"
        src.write_bytes(msgpack.packb(cases, use_bin_type=True))
        done = subprocess.run(
            [java, "-cp", classpath, HARNESS_CLASS, command, str(src), str(dst)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = msgpack.unpackb(dst.read_bytes(), raw=False)
        assert isinstance(out, list) and len(out) == len(cases)
        return out

    return run
