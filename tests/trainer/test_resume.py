"""Exact resume with 1 and 2 processes (SIGKILL right after a checkpoint), and 2 -> 1 ranks (universal checkpoint).

Each run is a real ``spoolrl train-node`` process (torchrun for 2 ranks) on a run directory whose
spool holds the same known trajectories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpc.metrics import read_metrics
from train_node.trainer import checkpoint as ckpt

from .helpers import free_port, make_run, run_config, standard_groups, write_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def train_node(run: Path, nproc: int, *overrides: str, fault: str = "") -> int:
    env = dict(os.environ, OMP_NUM_THREADS="1", SPOOLRL_FAULT=fault,
               MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    cli = ["-m", "hpc.cli", "train-node", str(run), *overrides, "--max-idle-s", "20"]
    if nproc == 1:
        cmd = [sys.executable, *cli]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_port", env["MASTER_PORT"], *cli]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode not in (0, -signal.SIGKILL, 1):
        print(proc.stdout[-3000:], proc.stderr[-5000:])
    return proc.returncode


def losses(run: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(run, "train_step")}


def _prepare(root: Path, stage: int) -> Path:
    cfg = run_config(trainer={"zero_stage": stage, "checkpoint_every": 2, "total_steps": 2, "lr": 3e-3,
                              "micro_batch_tokens": 64})
    paths = make_run(root, cfg)
    write_groups(paths.root, standard_groups(12, seed=7))
    return paths.root


@pytest.mark.parametrize(("nproc", "stage"), [(1, 0), (2, 2)])
def test_resume_after_kill_is_bit_exact(tmp_path: Path, nproc: int, stage: int) -> None:
    ref, run = _prepare(tmp_path / "ref", stage), _prepare(tmp_path / "run", stage)
    steps = 4 if nproc == 2 else 3
    assert train_node(ref, nproc, f"trainer.total_steps={steps}") == 0
    # killed right after the step-2 checkpoint flipped LATEST, before the spool commit
    assert train_node(run, nproc, "trainer.total_steps=3", fault="after_checkpoint:1") != 0
    assert ckpt.latest_tag(ckpt.RunPaths(run)) == "step_000002"
    assert train_node(run, nproc, "trainer.total_steps=3") == 0
    got, want = losses(run), losses(ref)
    assert sorted(got) == [1, 2, 3]
    assert got[3] == want[3], (got, want)  # bit for bit
    assert got[1] == want[1] and got[2] == want[2]
    ledger = [e for m in ckpt.lineage(ckpt.RunPaths(run)) for e in ckpt.read_ledger(ckpt.RunPaths(run), m["tag"])]
    assert len({e["trajectory_id"] for e in ledger}) == len(ledger) == 3 * 2 * 4
    if nproc == 2:
        # the same lineage resumed by one process: ZeRO-2 state saved by 2 ranks, loaded through a universal checkpoint
        assert train_node(run, 1, "trainer.total_steps=4") == 0
        start = [r for r in read_metrics(run, "trainer_start")][-1]
        assert start["resumed_from"] == "step_000003" and start["world_size"] == 1
        assert (run / "checkpoints" / "step_000003" / "universal").is_dir()
        assert losses(run)[4] == pytest.approx(want[4], rel=1e-5, abs=1e-6)
