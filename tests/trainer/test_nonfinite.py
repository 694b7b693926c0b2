"""The non-finite guard: a NaN/inf on one rank skips the update on every rank; too many in a row stop the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpc.metrics import read_metrics
from train_node.trainer import engine as engine_module
from train_node.trainer.engine import NonFiniteError
from train_node.trainer.loop import Options, Trainer
from train_node.trainer.loss import policy_loss

from .helpers import free_port, make_run, run_config, single_process_env, standard_groups, tiny_model, write_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def test_a_nan_or_inf_on_one_rank_skips_the_update_on_both(tmp_path: Path) -> None:
    """2 ranks, ZeRO-0 fp32, gloo (where DeepSpeed itself would apply a NaN): rank 1 alone sees a NaN loss, then
    rank 1 alone an infinite gradient; both ranks skip both updates (weights, Adam state and lr schedule as they
    were), then train the clean batch identically."""
    tiny_model(tmp_path / "model", seed=3)
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=port, SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    worker = str(Path(__file__).with_name("nonfinite_worker.py"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port, worker,
           str(tmp_path / "model"), str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    logs = [json.loads((tmp_path / f"out.{r}.json").read_text()) for r in (0, 1)]
    for log in logs:
        nan_loss, inf_grad, clean = log
        assert (nan_loss["nonfinite"], inf_grad["nonfinite"], clean["nonfinite"]) == ("loss", "grad_norm", "")
        for skipped in (nan_loss, inf_grad):
            assert skipped["updates"] == 0 and skipped["unchanged"] and skipped["adam_steps"] == []
            assert skipped["last_epoch"] == 0 and skipped["lr"] == pytest.approx(1e-2 / 4)  # warm-up step 0
        assert clean["updates"] == 1 and not clean["unchanged"] and clean["finite"]
        assert clean["adam_steps"] and set(clean["adam_steps"]) == {1.0} and clean["last_epoch"] == 1
    assert logs[0][2]["checksum"] == logs[1][2]["checksum"]


def _nan_on(plan: list[bool]) -> Any:
    """``policy_loss`` whose loss is NaN on the steps ``plan`` marks (one micro-batch a step; test-side only)."""
    steps = iter(plan)

    def loss_fn(*args: Any, **kwargs: Any) -> Any:
        loss, sums = policy_loss(*args, **kwargs)
        return (loss * float("nan"), sums) if next(steps, False) else (loss, sums)

    return loss_fn


def test_skipped_steps_publish_nothing_are_counted_and_too_many_in_a_row_stop(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """NaN, finite, NaN, NaN with trainer.max_nonfinite_steps 2: the skipped steps publish nothing, drop their
    batches and are counted; the second in a row stops the trainer with NonFiniteError."""
    cfg = run_config(trainer={"total_steps": 10, "checkpoint_every": 100, "micro_batch_tokens": 4096,
                              "max_nonfinite_steps": 2})
    paths = make_run(tmp_path / "run", cfg)
    write_groups(paths.root, standard_groups(8))  # 4 batches of 2 groups
    monkeypatch.setattr(engine_module, "policy_loss", _nan_on([True, False, True, True]))
    t = Trainer(paths.root, cfg, Options(max_idle_s=20.0), dist=single_process_env())
    t.setup()
    with pytest.raises(NonFiniteError, match=r"2 steps in a row .*trainer.max_nonfinite_steps = 2"):
        t.run()
    steps = list(read_metrics(paths.root, "train_step"))
    assert [(s["step"], s["nonfinite_steps"]) for s in steps] == [(1, 1)]
    skipped = list(read_metrics(paths.root, "nonfinite_step"))  # a finite step resets the count in a row
    assert [(s["step"], s["nonfinite_steps"], s["in_a_row"]) for s in skipped] == [(0, 1, 1), (1, 2, 1), (1, 3, 2)]
    assert all(s["nonfinite"] == "loss" for s in skipped)
    stop = list(read_metrics(paths.root, "trainer_stop"))[-1]
    assert stop["reason"] == "nonfinite" and stop["nonfinite_steps"] == 3 and stop["exit_code"] != 0
    assert (paths.policy / "LATEST").read_text().strip() == "1"  # v0 + the one step that applied
    assert t.consumer.drops["nonfinite"] == 3 * 2 * 4  # 3 skipped batches of 2 groups x 4 samples
    assert np.isfinite([s["loss"] for s in steps]).all()
