"""``spoolrl train-node RUN`` as a process: SIGTERM -> checkpoint, then exit 75 (requeue); resume continues."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc.metrics import read_metrics
from tests.proctree import children
from train_node.trainer import checkpoint as ckpt

from .helpers import free_port, make_run, run_config, standard_groups, write_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(300)]


def test_sigterm_checkpoints_and_exits_for_requeue(tmp_path: Path) -> None:
    """SIGTERM: checkpoint, exit 75 for the requeue. The node starts no child process (one srun task
    per rank): proctrack/linuxproc signals a step's children before the role (tests/proctree.py),
    so the node's SIGTERM is the first and only one."""
    cfg = run_config(trainer={"checkpoint_every": 100, "total_steps": 100})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(4))  # two steps of data, then it waits for more
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()), SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    proc = subprocess.Popen([sys.executable, "-m", "hpc.cli", "train-node", str(paths.root)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while len(list(read_metrics(paths.root, "train_step"))) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    kids = [Path(f"/proc/{p}/cmdline").read_bytes() for p in children(proc.pid)]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert kids == [], kids
    assert proc.returncode == 75, err[-3000:]
    stop = list(read_metrics(paths.root, "trainer_stop"))[-1]
    assert stop["reason"] == "signal:SIGTERM" and stop["exit_code"] == 75
    assert ckpt.latest_tag(paths) == "step_000002-g1"  # step, then the fencing generation
    # all four groups' shards are covered and committed
    assert not list((paths.spool / "shards" / "ready").glob("*.shard"))
    assert len(list((paths.spool / "shards" / "committed").glob("*.shard"))) == 4
