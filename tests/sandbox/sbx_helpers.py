"""Helpers for the sandbox tests: the test image, the unprivileged CI user, apptainer.

Missing components skip with a reason starting ``component unavailable:`` (accepted by the
top-level conftest in CI): the test image (``scripts/build_image.sh``) and Apptainer
(``scripts/install_apptainer.sh``, whose recorded failure reason is shown).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_node.sandbox import default_image
from rollout_node.sandbox.runtimes import apptainer_unavailable_reason, find_apptainer, find_bwrap

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable


def need_image() -> str:
    image = default_image()
    if not Path(image, ".spoolrl-image").exists():
        pytest.skip(f"component unavailable: test image {image} not built (run scripts/build_image.sh)")
    return image


def need_runtime(runtime: str) -> None:
    if runtime == "bwrap" and not find_bwrap():
        pytest.skip("component unavailable: bwrap not found (apt-get install bubblewrap)")
    if runtime == "apptainer" and not find_apptainer():
        pytest.skip(f"component unavailable: {apptainer_unavailable_reason()}")
    if runtime != "local":
        need_image()


def json_lines(proc: subprocess.CompletedProcess[str]) -> list[dict]:
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result (rc {proc.returncode}); stderr:\n{proc.stderr[-3000:]}"
    return lines
