"""The KL-adaptive lr schedule (trainer.target_kl): the controller's rule, its state, and the KL it reads."""

from __future__ import annotations

import math

import pytest
import torch

from train_node.trainer.lrschedule import (
    FACTOR,
    MIN_SCALE,
    START_SCALE,
    LrSchedule,
    apply_now,
    kl_totals,
    mean_token_kl,
    sequence_kl,
)


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


def _step_kl(length: int, shift: float, masked: int = 2) -> float:
    """The engine's reduction (kl_totals summed, then mean_token_kl) over 8 samples of ``length`` loss tokens,
    each token's logprob moved by +-``shift``, plus ``masked`` samples trained with no loss tokens."""
    gen = torch.Generator().manual_seed(length)
    totals = torch.zeros(3, dtype=torch.float64)
    for i in range(8 + masked):
        old = -torch.rand(length, generator=gen, dtype=torch.float64) * 5
        sign = torch.randint(0, 2, (length,), generator=gen).double() * 2 - 1
        mask = torch.full((length,), 0.0 if i >= 8 else 1.0, dtype=torch.float64)
        totals += kl_totals(old, old + shift * sign, mask, torch.ones(length, dtype=torch.float64))
    kl, signal = mean_token_kl(totals)
    assert signal
    return kl


@pytest.mark.parametrize("length", [40, 10_000])
def test_the_target_is_per_loss_token_for_short_and_long_trajectories(length: int) -> None:
    """trainer.target_kl in nats per loss token (the demo's 6e-4): the same per-token movement reads the same
    for 40-token and 10,000-token trajectories, masked samples do not dilute it, and the controller makes the
    same decisions. (Per sample, a 10,000-token trajectory moving 4e-4 per token reads 4 nats and the lr falls
    to its floor.)"""
    shift = math.sqrt(2 * 4e-4)  # k3(r) ~ (log r)^2 / 2 = 4e-4 per token
    kl = _step_kl(length, shift)
    assert kl == pytest.approx(4e-4, rel=0.02)
    assert kl == pytest.approx(_step_kl(length, shift, masked=0), rel=1e-12)
    target = 6e-4
    for kl_per_token, final in ((4e-4, START_SCALE), (1e-4, 1.0), (5e-3, MIN_SCALE)):
        s = LrSchedule(warmup_steps=0, target_kl=target)
        for _ in range(30):
            s.observe(_step_kl(length, math.sqrt(2 * kl_per_token)))
        assert s.scale == pytest.approx(final), (length, kl_per_token)
