"""The fake role records a signal however Slurm delivers it (no Slurm needed).

proctrack/linuxproc signals a step's process tree deepest first (kill_tree.c prepends each child
before its own children), and under load slurmstepd can stall between two kill() calls. A fake
that waited on a ``sleep`` child saw it die, took that for the end of its plan and exited before
its own signal came: a bare ``scontrol requeue`` then found no SIGTERM record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from slurm_helpers import FAKE_PYTHON

from tests.proctree import deepest_first


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGUSR1])
def test_signal_recorded_when_the_tree_is_signalleddeepest_first(tmp_path: Path, sig: signal.Signals) -> None:
    env = {**os.environ, "SLURMD_NODENAME": "n1", "SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}
    proc = subprocess.Popen(
        [str(FAKE_PYTHON), "-m", "hpc.cli", "train-node", str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
    )
    tag = "train-n1-0-j7-r0"
    assert proc.stdout is not None and proc.stdout.readline().startswith(f"started {tag}")
    time.sleep(0.2)  # into its wait for the plan
    for pid in deepest_first(proc.pid):
        with contextlib.suppress(ProcessLookupError):  # slurmstepd ignores ESRCH too
            os.kill(pid, sig)
        time.sleep(0.3)  # the stall between two kill() calls that a loaded slurmstepd can take
    out, _ = proc.communicate(timeout=10)
    record = tmp_path / "fake" / f"{tag}.signals"
    assert record.exists() and record.read_text().split() == [sig.name.removeprefix("SIG")], f"fake said: {out!r}"
    assert proc.returncode == 0 and "ending" not in out
