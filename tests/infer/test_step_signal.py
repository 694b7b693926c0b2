"""A real infer node whose step Slurm signals deepest first: the server's death is a stop, not a failure.

proctrack/linuxproc sends a step's SIGTERM (``scontrol requeue``, preemption, time limit) to the children
before their parents, with up to ~1 s between two kill() calls under load (see
tests/slurm/test_fake_python.py). The CPU server stops answering as soon as its SIGTERM arrives; a node that
gave up on it at once exited 1 before its own SIGTERM came, and the batch script ended the job as "infer
group failed" instead of letting it requeue. A server that fails with no stop coming still ends the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpc.cli.run import init_run
from hpc.config import load_config
from hpc.paths import RunPaths
from tests.proctree import deepest_first

REPO = Path(__file__).resolve().parents[2]
# give up after the first failure, seen within ~0.3 s (3 checks 0.1 s apart): inside the signalling gap
CONFIG = ["inference.engine=cpu", "inference.cpu_threads=1", "inference.heartbeat_s=0.1", "inference.max_restarts=0",
          "slurm.infer.gpus_per_node=0"]


def _serving_node(tmp_path: Path) -> tuple[RunPaths, subprocess.Popen[bytes], int]:
    paths = RunPaths(tmp_path / "run")
    init_run(str(paths.root), load_config(None, CONFIG))
    proc = subprocess.Popen([sys.executable, "-m", "hpc.cli", "infer-node", str(paths.root)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while not (files := list(paths.endpoints.glob("infer-*.json"))):
        assert proc.poll() is None and time.monotonic() < deadline, f"infer-node exited: {proc.returncode}"
        time.sleep(0.1)
    return paths, proc, int(json.loads(files[0].read_text())["server_pid"])


def _stderr(proc: subprocess.Popen[bytes]) -> str:
    return proc.stderr.read().decode()[-2000:] if proc.stderr else ""


def test_server_signalled_first_then_the_node_exits_0(tmp_path: Path) -> None:
    paths, proc, server_pid = _serving_node(tmp_path)
    try:
        order = deepest_first(proc.pid)
        assert order.index(server_pid) < order.index(proc.pid)
        for pid in order:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            time.sleep(1.0)  # a loaded slurmstepd's stall between two kill() calls
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 0, _stderr(proc)
    assert not list(paths.endpoints.glob("*.json"))


def test_server_failing_with_no_stop_coming_still_ends_the_node(tmp_path: Path) -> None:
    _paths, proc, server_pid = _serving_node(tmp_path)
    try:
        os.kill(server_pid, signal.SIGTERM)
        rc = proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 1 and "failed 1 times in a row" in _stderr(proc)
