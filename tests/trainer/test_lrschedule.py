"""The KL-adaptive lr schedule (trainer.target_kl): the controller's rule, its state, and the KL it reads."""

from __future__ import annotations

import math

import pytest
import torch

from train_node.trainer.lrschedule import FACTOR, MIN_SCALE, START_SCALE, LrSchedule, apply_now, sequence_kl


def test_off_is_the_warmup_alone() -> None:
    s = LrSchedule(warmup_steps=4, target_kl=0.0)
    assert [s(k) for k in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    s.observe(123.0)
    assert s.scale == 1.0


def test_the_scale_follows_the_measured_kl_within_its_bounds() -> None:
    s = LrSchedule(warmup_steps=0, target_kl=0.1)
    assert s(0) == START_SCALE
    s.observe(0.15)  # within [target / 2, 2 target]: unchanged
    assert s.scale == START_SCALE
    s.observe(0.3)
    assert s.scale == pytest.approx(START_SCALE / FACTOR)
    for _ in range(40):
        s.observe(0.01)
    assert s.scale == 1.0, "trainer.lr stays the peak"
    for _ in range(40):
        s.observe(10.0)
    assert s.scale == MIN_SCALE


def test_the_scale_survives_the_schedulers_state_dict_and_apply_now_sets_the_next_lr() -> None:
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.AdamW([param], lr=1e-3)
    sched_fn = LrSchedule(warmup_steps=0, target_kl=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, sched_fn)
    sched_fn.observe(1.0)
    assert apply_now(sched, sched_fn) == pytest.approx(1e-3 * START_SCALE / FACTOR)
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0] == pytest.approx(1e-3 * START_SCALE / FACTOR)
    fresh_fn = LrSchedule(warmup_steps=0, target_kl=0.1)
    fresh = torch.optim.lr_scheduler.LambdaLR(torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3),
                                              fresh_fn)
    fresh.load_state_dict(sched.state_dict())
    assert fresh_fn.scale == sched_fn.scale


def test_sequence_kl_is_the_k3_sum_over_loss_tokens() -> None:
    old = torch.log(torch.tensor([0.5, 0.25, 0.9]))
    new = torch.log(torch.tensor([0.25, 0.25, 0.1]))
    mask = torch.tensor([1.0, 1.0, 0.0])
    r = 0.5  # the first token's ratio; the second is unchanged, the third is not a loss token
    assert float(sequence_kl(old, new, mask)) == pytest.approx(r - 1 - math.log(r))
    assert float(sequence_kl(old, old, mask)) == 0.0
