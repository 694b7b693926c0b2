"""Packing is exact: 1 rank with every sequence alone (unpacked) vs 2 ranks with packed micro-batches.

Same tiny fp32 model, same 12 samples (mixed lengths, advantages, temperatures): the gradients the
optimizer receives agree to 1e-6, so token-level aggregation is independent of packing and ranks.
The 2-rank run then checks the non-finite guard (nonfinite_worker.py) on the same engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from .helpers import free_port, tiny_model

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def _run(model: Path, out: Path, nproc: int, mbt: int, *extra: str) -> None:
    worker = str(Path(__file__).with_name("grad_worker.py"))
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=port, SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    args = [worker, str(model), str(out), str(mbt), *extra]
    cmd = [sys.executable, *args] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", port, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_two_ranks_packed_equal_one_rank_unpacked(tmp_path: Path) -> None:
    tiny_model(tmp_path / "model", seed=3)
    _run(tmp_path / "model", tmp_path / "one.pt", 1, 1)  # capacity 1 token: every sequence its own micro-batch
    _run(tmp_path / "model", tmp_path / "two.pt", 2, 96, str(tmp_path / "guard"))
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one["micro_batches"] == [12] and len(two["micro_batches"]) == 2 and two["micro_batches"][0] < 6
    assert one["tokens"] == two["tokens"]
    assert one["loss"] == pytest.approx(two["loss"], rel=1e-6)
    assert set(one["grads"]) == set(two["grads"])
    worst = max(float((one["grads"][k] - two["grads"][k]).abs().max()) for k in one["grads"])
    assert worst <= 1e-6, worst
    assert max(float(g.abs().max()) for g in one["grads"].values()) > 1e-3  # the gradient is not trivially zero
    _assert_guard([json.loads((tmp_path / f"guard.{r}.json").read_text()) for r in (0, 1)])


def _assert_guard(logs: list[list[dict[str, Any]]]) -> None:
    """2 ranks, ZeRO-0 fp32, gloo (where DeepSpeed itself would apply a NaN): rank 1 alone sees a NaN loss, then
    rank 1 alone an infinite gradient; both ranks skip both updates (weights, Adam state and lr schedule as they
    were), then train the clean batch identically."""
    for before, nan_loss, inf_grad, clean in logs:
        assert (nan_loss["nonfinite"], inf_grad["nonfinite"], clean["nonfinite"]) == ("loss", "grad_norm", "")
        for skipped in (nan_loss, inf_grad):
            assert skipped["updates"] == 0 and skipped["unchanged"]
            assert {k: skipped[k] for k in ("adam_steps", "last_epoch", "lr")} == \
                {k: before[k] for k in ("adam_steps", "last_epoch", "lr")}
        assert clean["updates"] == 1 and not clean["unchanged"] and clean["finite"]
        assert clean["adam_steps"] == [before["adam_steps"][0] + 1] and clean["last_epoch"] == before["last_epoch"] + 1
    assert logs[0][3]["checksum"] == logs[1][3]["checksum"]
