"""The Java codec harness run from Python: ``CodecHarness`` (msgpack in, msgpack out) in a JVM
with the provider's jar, for the differential tests that hold Java to Python byte for byte
(tests/ring/test_java_codec.py, tests/ring/test_hostile_input.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

Harness = Callable[[str, list[Any]], list[Any]]


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


def harness_at(work: Path) -> Harness:
    """The CodecHarness runner, its files in ``work``; skips (saying why) without a JDK or
    pyspark, and fails when the provider does not compile (a broken build must not pass as
    a skip)."""
    tools = _java_tools()
    if isinstance(tools, str):
        pytest.skip(tools)
    _, java = tools
    import spark_connector._build as build

    try:
        home, _ = build.pyspark_home()
    except build.SparkConnectorError as exc:
        pytest.skip(f"the provider jar cannot be built here: {exc}")
    jar = build.jar_path()  # a compile error fails the test with javac's message
    classpath = f"{jar}{os.pathsep}{home / 'jars' / '*'}"

    def run(command: str, cases: list[Any]) -> list[Any]:
        src, dst = work / f"{command}.in", work / f"{command}.out"
        src.write_bytes(msgpack.packb(cases, use_bin_type=True))
        done = subprocess.run(
            [java, "-cp", classpath, "statestore.spark.CodecHarness", command, str(src), str(dst)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        out = msgpack.unpackb(dst.read_bytes(), raw=False)
        assert isinstance(out, list) and len(out) == len(cases)
        return out

    return run
