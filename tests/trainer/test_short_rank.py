"""A rank short of work trains: the planner pads its share with the dummy micro-batch (one token, loss mask 0:
``packing.build_micro_batch([])``), and the engine's LM head, which runs only at loss positions, has none there.
Before the fix that made the head's chunked pass handle no positions, such a step raised in ``torch.cat``."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from train_node.trainer.loop import Options, Trainer
from train_node.trainer.packing import Sample, build_micro_batch

from .helpers import make_run, run_config, single_process_env

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def test_a_step_with_the_dummy_micro_batch_trains_the_real_one(tmp_path: Path) -> None:
    cfg = run_config(trainer={"total_steps": 1, "checkpoint_every": 100})
    t = Trainer(make_run(tmp_path / "run", cfg).root, cfg, Options(max_idle_s=5.0), dist=single_process_env())
    t.setup()
    rng = np.random.default_rng(3)
    n = 24
    mask = np.zeros(n, dtype=np.int8)
    mask[8:] = 1
    lp = np.where(mask == 1, -rng.uniform(3, 7, n), 0).astype(np.float32)
    real = build_micro_batch([Sample("t0", rng.integers(3, 300, n).astype(np.int32), mask, lp, 1.0, 1.0)])
    dummy = build_micro_batch([])
    assert dummy.mask.sum() == 0 and len(dummy.input_ids) == 1
    before = {k: v.detach().clone() for k, v in t.engine.module.state_dict().items()}
    result = t.engine.train_step([real, dummy])
    assert result.nonfinite == "" and result.updates == 1 and math.isfinite(result.sums.loss)
    assert result.sums.tokens == float(real.mask.sum())  # the real micro-batch's loss tokens, none from the dummy
    after = t.engine.module.state_dict()
    assert any(not bool((after[k] == v).all()) for k, v in before.items()), "the real micro-batch trained"
