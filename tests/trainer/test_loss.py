"""The objective against hand-computed values (no DeepSpeed needed)."""

from __future__ import annotations

import math

import pytest
import torch

from train_node.trainer.loss import LossParams, group_advantages, policy_loss, token_logprobs

P = LossParams(clip_low=0.2, clip_high=0.28, tis_cap=2.0)


def _loss(ratios: list[float], advs: list[float], mask: list[float], total: float, params: LossParams = P):
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    beh = torch.zeros(len(ratios), dtype=torch.float64)
    loss, sums = policy_loss(logp, beh, torch.tensor(advs, dtype=torch.float64),
                             torch.tensor(mask, dtype=torch.float64), params=params, total_tokens=total)
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), logp.grad.tolist(), sums


def test_unclipped_tokens_give_minus_advantage_times_ratio():
    loss, grad, sums = _loss([1.1, 0.9], [2.0, -1.0], [1, 1], total=2)
    # (-2*1.1 + 1*0.9) / 2
    assert loss == pytest.approx((-2.2 + 0.9) / 2)
    # d/dlogp of -A*r/N = -A*r/N
    assert grad == pytest.approx([-2.0 * 1.1 / 2, 1.0 * 0.9 / 2])
    assert sums.clipped == 0 and sums.tokens == 2


def test_asymmetric_clip_zeroes_the_gradient_beyond_the_bounds():
    # A>0, r=1.5 > 1.28 -> clipped at 1.28; A<0, r=0.5 < 0.8 -> clipped at 0.8
    loss, grad, sums = _loss([1.5, 0.5], [1.0, -1.0], [1, 1], total=2)
    assert loss == pytest.approx((-1.28 + 0.8) / 2)
    assert grad == pytest.approx([0.0, 0.0])
    assert sums.clipped == 2
    # inside the high side only thanks to clip_high > clip_low: r=1.25 not clipped for A>0
    loss, grad, _ = _loss([1.25], [1.0], [1], total=1)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx([-1.25])


def test_negative_advantage_ratio_is_truncated_at_tis_cap():
    # A<0, r=3 > cap 2: unclipped branch would give 3*|A|; truncated to 2*|A|, no gradient
    loss, grad, sums = _loss([3.0], [-0.5], [1], total=1)
    assert loss == pytest.approx(1.0)
    assert grad == pytest.approx([0.0])
    assert sums.clipped == 1
    # A<0, r=1.5 (between 1+clip_high and cap): the unclipped branch is the max -> full gradient
    loss, grad, _ = _loss([1.5], [-0.5], [1], total=1)
    assert loss == pytest.approx(0.75) and grad == pytest.approx([0.75])


def test_mask_and_global_token_count():
    # the masked token contributes nothing; dividing by the step's global count (4), not the local one
    loss, grad, sums = _loss([1.0, 5.0], [1.0, 1.0], [1, 0], total=4)
    assert loss == pytest.approx(-1.0 / 4)
    assert grad == pytest.approx([-1.0 / 4, 0.0])
    assert sums.tokens == 1 and sums.loss == pytest.approx(-1.0)


def test_kl_penalty_k3():
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([math.log(0.25)], dtype=torch.float64)
    params = LossParams(kl_coef=0.1)
    loss, sums = policy_loss(logp, logp.detach().clone(), torch.tensor([0.0], dtype=torch.float64),
                             torch.ones(1, dtype=torch.float64), params=params, total_tokens=1, ref_logp=ref)
    # delta = log(0.25/0.5) = -log 2 ; k3 = 0.5 + log 2 - 1
    k3 = 0.5 + math.log(2) - 1
    assert sums.kl == pytest.approx(k3)
    assert float(loss) == pytest.approx(0.1 * k3)


def test_advantage_sign_flip_negates_unclipped_loss():
    loss, _, _ = _loss([1.0], [1.5], [1], total=1, params=LossParams(advantage_sign=-1.0))
    assert loss == pytest.approx(1.5)


def test_token_logprobs_use_the_sampling_temperature():
    logits = torch.tensor([[2.0, 0.0, 0.0]])
    lp_t1 = token_logprobs(logits, torch.tensor([0]), torch.tensor([1.0]))
    lp_t2 = token_logprobs(logits, torch.tensor([0]), torch.tensor([0.5]))
    assert float(lp_t1) == pytest.approx(2 - math.log(math.e ** 2 + 2))
    assert float(lp_t2) == pytest.approx(1 - math.log(math.e + 2))


def test_group_advantages():
    assert group_advantages([1.0, 0.0], "group_std") == pytest.approx([1.0, -1.0], abs=1e-5)
    assert group_advantages([1.0, 0.0, 0.0, 0.0], "group_mean") == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # population std of [3, 1] is 1
    assert group_advantages([3.0, 1.0], "group_std") == pytest.approx([1.0, -1.0], abs=1e-5)
