"""The provider harness (tests/spark/java: ``ProviderHarness``), compiled against pyspark's
jars and the provider jar, and one scenario run in its own JVM: shared by the provider's
stress and bounded-memory tests."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from spark_connector import _build

from .jvm import JVM_FLAGS

__all__ = ["compile_harness", "harness"]

HARNESS = Path(__file__).with_name("java")


def compile_harness(out: Path) -> str:
    """The harness compiled into ``out`` against pyspark's jars and the provider jar: its
    classpath (tests/spark/conftest.py's ``classpath`` fixture)."""
    home, _ = _build.pyspark_home()
    jar = _build.jar_path()
    cp = f"{jar}:{home / 'jars' / '*'}"
    sources = [str(p) for p in HARNESS.rglob("*.java")]
    javac = shutil.which("javac")
    assert javac is not None
    subprocess.run(
        [javac, "--release", "17", "-nowarn", "-cp", cp, "-d", str(out), *sources],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return f"{out}:{cp}"


def harness(
    classpath: str,
    scenario: str,
    root: Path,
    timeout: float = 240,
    jvm: tuple[str, ...] = (),
    **conf: Any,
) -> dict[str, Any]:
    """Run ``scenario`` of the harness on the store root ``root`` with the provider options
    ``conf`` (and JVM options ``jvm``); its RESULT object."""
    cmd = ["java", "-Xmx1g", *JVM_FLAGS, *jvm, "-cp", classpath]
    cmd.append("statestore.spark.ProviderHarness")
    cmd += [scenario, str(root), *(f"{k}={v}" for k, v in conf.items())]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    tail = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert lines, f"harness failed ({done.returncode}):\n{tail}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result
