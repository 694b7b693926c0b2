"""The non-finite guard in the train loop: skipped steps publish nothing, are counted, and too many in a row stop
the trainer. (A NaN/inf on one of 2 ranks skipping the update on both: test_grad_exact.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpc.metrics import read_metrics
from train_node.trainer import engine as engine_module
from train_node.trainer.engine import NonFiniteError
from train_node.trainer.loop import Options, Trainer
from train_node.trainer.loss import policy_loss

from .helpers import make_run, run_config, single_process_env, standard_groups, write_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


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
    with pytest.raises(NonFiniteError, match=r"2 steps in a row .*trainer.max_nonfinite_steps = 2\)"):
        t.run()
    steps = list(read_metrics(paths.root, "train_step"))
    assert [(s["step"], s["nonfinite_steps"]) for s in steps] == [(1, 1)]
    skipped = list(read_metrics(paths.root, "nonfinite_step"))  # a finite step resets the count in a row
    assert [(s["step"], s["nonfinite_steps"], s["in_a_row"]) for s in skipped] == [(0, 1, 1), (1, 2, 1), (1, 3, 2)]
    assert all(s["nonfinite"] == "loss" for s in skipped)
    stop = list(read_metrics(paths.root, "trainer_stop"))[-1]
    assert stop["reason"] == "nonfinite" and stop["nonfinite_steps"] == 3 and stop["exit_code"] != 0
    assert (paths.policy / "LATEST").read_text().strip() == "1"  # v0 + the one step that applied
    assert t.lead.consumer.drops["nonfinite"] == 3 * 2 * 4  # 3 skipped batches of 2 groups x 4 samples
    assert np.isfinite([s["loss"] for s in steps]).all()
