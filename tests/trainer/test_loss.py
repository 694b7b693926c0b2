"""The objective against hand-computed values (no DeepSpeed needed)."""

from __future__ import annotations

import math

import pytest
import torch

from hpc.config import AlgorithmConfig
from train_node.trainer.loss import (
    K3_MAX,
    LossParams,
    batch_advantages,
    forward_kl,
    group_advantages,
    k3,
    policy_loss,
    token_logprobs,
)

from .helpers import with_flipped_advantages

P = LossParams(clip_low=0.2, clip_high=0.28, tis_cap=2.0)


def _loss(ratios: list[float], advs: list[float], mask: list[float], total: float, params: LossParams = P,
          staleness: list[int] | None = None, loss_fn=policy_loss):
    """The loss at chosen importance ratios pi/mu (logp = log r against behaviour logprob 0)."""
    logp = torch.tensor([math.log(r) for r in ratios], dtype=torch.float64, requires_grad=True)
    beh = torch.zeros(len(ratios), dtype=torch.float64)
    loss, sums = loss_fn(logp, beh, torch.tensor(advs, dtype=torch.float64),
                             torch.tensor(mask, dtype=torch.float64), params=params, total_tokens=total,
                             staleness=None if staleness is None else torch.tensor(staleness))
    loss.backward()
    assert logp.grad is not None
    return float(loss.detach()), logp.grad.tolist(), sums


@pytest.mark.parametrize("ratio", [0.3, 0.8, 1.0, 1.25, 1.5, 1.99, 2.0, 3.0, 50.0])
@pytest.mark.parametrize("adv", [1.5, -0.5])
def test_gradient_is_minus_advantage_times_truncated_weight(ratio: float, adv: float) -> None:
    """The documented formula: d loss / d logp = -A * min(pi/mu, tis_cap) / N, for either sign of A
    and on both sides of the old clip bounds (no dual clip, no zeroed gradient)."""
    loss, grad, sums = _loss([ratio], [adv], [1], total=4)
    w = min(ratio, P.tis_cap)
    assert grad == pytest.approx([-adv * w / 4])
    assert loss == pytest.approx(-adv * w / 4)
    assert sums.truncated == (1.0 if ratio > P.tis_cap else 0.0)
    assert sums.weight == pytest.approx(w) and sums.ratio_dev == pytest.approx(abs(ratio - 1))
    assert sums.clipped == 0  # the proximal policy is the current one: the PPO clip cannot bind


def test_weight_is_detached_and_cap_is_configurable() -> None:
    _, grad, _ = _loss([3.0], [1.0], [1], total=1, params=LossParams(tis_cap=5.0))
    assert grad == pytest.approx([-3.0])
    _, grad, sums = _loss([3.0], [1.0], [1], total=1, params=LossParams(tis_cap=1.0))
    assert grad == pytest.approx([-1.0]) and sums.truncated == 1


def test_statistics_per_staleness_bucket() -> None:
    _, _, sums = _loss([1.0, 1.0, 1.5, 3.0, 0.5], [1.0] * 5, [1, 1, 1, 1, 0], total=4, staleness=[0, 0, 1, 5, 2])
    by = sums.by_staleness()
    assert set(by) == {"0", "1", "3+"}  # the masked stale-2 token counts nowhere
    assert by["0"] == {"tokens": 2.0, "ratio_dev": 0.0, "truncated_fraction": 0.0, "weight_mean": 1.0}
    assert by["1"]["ratio_dev"] == pytest.approx(0.5) and by["1"]["weight_mean"] == pytest.approx(1.5)
    assert by["3+"]["truncated_fraction"] == 1.0 and by["3+"]["weight_mean"] == pytest.approx(2.0)
    again = type(sums).from_tensor(sums.as_tensor())
    assert again.by_staleness() == by and again.weight == pytest.approx(sums.weight)


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


def test_forward_kl_is_exact_and_is_the_expected_k3_gradient_without_its_variance():
    """KL(ref || pi) over the vocabulary: exact, zero at the reference, gradient (p - p_ref) / T on the logits.
    k3 on a sampled token has the same gradient in expectation over the policy's samples; one sample's
    gradient on a rare token is ~0 unless that token is the one sampled, when it is large: variance."""
    inv_t = torch.tensor([1 / 0.7], dtype=torch.float64)
    ref = torch.zeros(1, 4, dtype=torch.float64)  # uniform
    logits = torch.tensor([[1.0, 0.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)  # k3 below its cap
    kl = forward_kl(logits, ref, inv_t)
    p = torch.softmax(logits.detach() * inv_t, -1)
    assert float(kl) == pytest.approx(float((0.25 * (math.log(0.25) - torch.log(p))).sum()))
    assert float(forward_kl(ref, ref, inv_t)) == pytest.approx(0.0, abs=1e-12)
    kl.sum().backward()
    assert logits.grad is not None
    exact = logits.grad[0]
    assert exact.tolist() == pytest.approx(((p - 0.25) * inv_t)[0].tolist())

    def k3_grad(token: int) -> torch.Tensor:
        z = logits.detach().clone().requires_grad_(True)
        target = torch.tensor([token])
        k3(token_logprobs(z, target, inv_t), token_logprobs(ref, target, inv_t)).sum().backward()
        assert z.grad is not None
        return z.grad[0]

    per_sample = [k3_grad(x) for x in range(4)]
    expected = sum(float(p[0, x]) * g for x, g in enumerate(per_sample))
    assert isinstance(expected, torch.Tensor)
    assert expected.tolist() == pytest.approx(exact.tolist(), abs=1e-6)  # token_logprobs works in fp32
    # the rare token 2 (p = 0.04): -0.30 exactly, but -0.03 from the likely sample and -7.8 from its own
    assert abs(float(per_sample[0][2])) < 0.05 and float(per_sample[2][2]) < -5.0


def test_k3_is_clamped_as_verl_and_openrlhf_do():
    """A token the policy has left far behind the reference (a stale sample) gives k3 = exp(d) - d - 1 with
    d ~ 100: inf in fp32 unclamped. Clamped (d to +-20, the value to 10), the term and the gradient are finite."""
    logp = torch.tensor([-100.0, math.log(0.5)], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.25)])
    zero, one = torch.zeros(2), torch.ones(2)
    loss, sums = policy_loss(logp, logp.detach().clone(), zero, one, params=LossParams(kl_coef=0.1), total_tokens=2,
                             ref_logp=ref)
    loss.backward()
    assert logp.grad is not None
    assert math.isfinite(float(loss)) and bool(torch.isfinite(logp.grad).all())
    assert sums.kl == pytest.approx(K3_MAX + (0.5 + math.log(2) - 1), rel=1e-5)  # the far token at the cap
    # the lower side: d clamped to -20, exp(-20) + 20 - 1 = 19.0000..., then capped at 10
    assert float(k3(torch.tensor([5.0]), torch.tensor([-100.0]))) == pytest.approx(K3_MAX)
    assert float(k3(torch.tensor([0.0]), torch.tensor([0.0]))) == 0.0


def test_the_clip_binds_against_a_proximal_policy_other_than_the_current_one():
    """algorithm.minibatches > 1: pi_prox is the weights before the step's first update, so a later update
    sees pi / pi_prox != 1 and the PPO clip zeroes the gradient of tokens already moved past it."""
    logp = torch.tensor([math.log(1.5), math.log(1.1), math.log(0.5)], dtype=torch.float64, requires_grad=True)
    prox = torch.zeros(3, dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    loss, sums = policy_loss(logp, prox.clone(), adv, torch.ones(3, dtype=torch.float64), params=P, total_tokens=3,
                             prox_logp=prox)
    loss.backward()
    assert sums.clipped == 2  # 1.5 > 1 + 0.28 with A > 0; 0.5 < 1 - 0.2 with A < 0
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([0.0, -1.1 / 3, 0.0])


def test_policy_loss_takes_the_forward_kl_when_asked():
    logp = torch.tensor([math.log(0.5)], dtype=torch.float64, requires_grad=True)
    fkl = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    one, zero = torch.ones(1, dtype=torch.float64), torch.tensor([0.0], dtype=torch.float64)
    params = LossParams(kl_coef=0.1, kl_estimator="forward")
    loss, sums = policy_loss(logp, logp.detach().clone(), zero, one, params=params, total_tokens=1,
                             forward_kl_tokens=fkl)
    assert sums.kl == pytest.approx(0.3) and float(loss) == pytest.approx(0.03)
    loss.backward()
    assert fkl.grad is not None
    assert float(fkl.grad) == pytest.approx(0.1)
    with pytest.raises(AssertionError, match="forward KL"):
        policy_loss(logp, logp.detach().clone(), zero, one, params=params, total_tokens=1)
    assert LossParams.from_config(AlgorithmConfig(kl_estimator="forward")).kl_estimator == "forward"


def test_advantage_sign_flip_negates_unclipped_loss():
    """The negative control's objective (test_learns.py patches it into the engine) is a true flip."""
    loss, grad, _ = _loss([1.0], [1.5], [1], total=1, loss_fn=with_flipped_advantages(policy_loss))
    assert loss == pytest.approx(1.5) and grad == pytest.approx([1.5])


def test_token_logprobs_use_the_sampling_temperature():
    """The trainer scores log_softmax(logits / T): the processed logprobs both engines record."""
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


def test_batch_advantages_keep_the_signal_of_a_group_that_all_failed():
    """One baseline for the step. A group whose samples all failed (a value the policy stopped giving for its
    statement) gets negative advantages, where a group baseline gives it none."""
    groups = [[1.0, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]  # mean 3/8, population std sqrt(15)/8
    centred = [0.625, 0.625, -0.375, 0.625, -0.375, -0.375, -0.375, -0.375]
    mean_adv = batch_advantages(groups, "batch_mean")
    std_adv = batch_advantages(groups, "batch_std")
    assert [len(g) for g in mean_adv] == [len(g) for g in std_adv] == [4, 4]
    assert mean_adv[0] + mean_adv[1] == pytest.approx(centred)
    assert std_adv[0] + std_adv[1] == pytest.approx([c / (15 ** 0.5 / 8) for c in centred], abs=1e-5)
    assert group_advantages(groups[1], "group_std") == [0.0] * 4
    assert batch_advantages([[0.0, 0.0], [0.0]], "batch_std") == [[0.0, 0.0], [0.0]], "no variance: no signal"


def test_batch_std_blows_up_a_rare_failure_and_batch_mean_does_not():
    """31 passes and one failure: the std shrinks to 0.17, so 'batch_std' gives the failure -5.6."""
    groups = [[1.0] * 8] * 3 + [[1.0] * 7 + [0.0]]
    assert batch_advantages(groups, "batch_std")[3][7] == pytest.approx(-(31 ** 0.5), rel=1e-4)
    assert batch_advantages(groups, "batch_mean")[3][7] == pytest.approx(-31 / 32)


def test_params_defaults_are_the_configs() -> None:
    assert LossParams() == LossParams.from_config(AlgorithmConfig())


def _head_pass(policy, ref, ids, pos, targets, inv_t, mask):
    """The engine's fp32 chunked head, 4 positions a chunk: (logprobs, forward KL against ``ref``), the KL 0 without
    ``ref``."""
    from train_node.trainer.engine import fp32_head_logprobs, fp32_head_logprobs_and_forward_kl

    if ref is not None:
        both = fp32_head_logprobs_and_forward_kl(policy, ref, ids, pos, targets, inv_t, chunk_tokens=4, mask=mask)
        assert both is not None
        return both
    lp = fp32_head_logprobs(policy, ids, pos, targets, inv_t, chunk_tokens=4, mask=mask)
    assert lp is not None
    return lp, torch.zeros_like(lp)


@pytest.mark.parametrize("masked", [False, True], ids=["every position", "loss positions only"])
@pytest.mark.parametrize("with_kl", [False, True], ids=["logprobs", "logprobs and forward KL"])
def test_chunked_head_equals_the_whole_head(tmp_path, monkeypatch, masked, with_kl):
    """The engine's fp32 chunked pass (several chunks, under checkpointing) gives the logprobs and the
    forward KL, and their gradients, that the model's own full logits give. With the loss mask it runs
    the head only at the mask's positions: there the same values, 0 elsewhere, and the same gradients for
    every loss that reads them through the mask (what the trainer's loss does)."""
    from transformers import AutoModelForCausalLM

    import train_node.trainer.engine as engine
    from train_node.infer.tiny import build_tiny_model

    head_rows: list[int] = []  # the positions each fp32 head application ran on (recomputes in backward too)
    fp32_logits = engine._fp32_logits
    def recording_fp32_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        head_rows.append(h.shape[0])
        return fp32_logits(h, w, b)

    monkeypatch.setattr(engine, "_fp32_logits", recording_fp32_logits)
    path = build_tiny_model(tmp_path / "tiny", seed=0)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).requires_grad_(False)
    with torch.no_grad():  # the policy has moved away from the reference
        for w in policy.parameters():
            w.add_(0.05 * torch.randn_like(w, generator=torch.Generator().manual_seed(1)))
    ids = torch.randint(5, 200, (11,), generator=torch.Generator().manual_seed(2))
    pos, targets = torch.arange(11), torch.roll(ids, -1)
    inv_t = torch.full((11,), 1 / 0.7)
    # a prompt, a generated turn, an observation, a second turn: 6 of 11 positions carry the loss
    mask = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1, 1, 1, 0], dtype=torch.float32) if masked else torch.ones(11)
    logp, kl = _head_pass(policy, ref if with_kl else None, ids, pos, targets, inv_t, mask if masked else None)
    ((logp + kl) * mask).sum().backward()
    # forward and the backward's recompute, the policy's head and (with the KL) the reference's
    assert sum(head_rows) == int(mask.sum()) * 2 * (2 if with_kl else 1)
    chunked = [None if w.grad is None else w.grad.clone() for w in policy.parameters()]
    policy.zero_grad()
    logits = policy(input_ids=ids[None], position_ids=pos[None]).logits[0]
    ref_logits = ref(input_ids=ids[None], position_ids=pos[None]).logits[0]
    logp2 = token_logprobs(logits, targets, inv_t)
    kl2 = forward_kl(logits, ref_logits, inv_t) if with_kl else torch.zeros(11)
    ((logp2 + kl2) * mask).sum().backward()
    on = mask > 0
    assert torch.allclose(logp[on], logp2[on], atol=1e-5) and torch.allclose(kl[on], kl2[on], atol=1e-5)
    if masked:  # not computed where nothing reads it
        assert float(logp.detach()[~on].abs().max()) == 0.0 and float(kl.detach()[~on].abs().max()) == 0.0
        assert float(logp2.detach()[~on].abs().min()) > 0  # (the full head's values there are real logprobs)
    if with_kl:
        assert float(kl.detach()[on].min()) > 0
    for a, w in zip(chunked, policy.parameters(), strict=True):
        assert a is not None and w.grad is not None
        # fp32 sums in another order: an absolute error of ~1e-6 of the largest entry (the embedding's reaches 16,
        # where two CPUs' kernels differed by 1.7e-5)
        assert torch.allclose(a, w.grad, atol=1e-5 + 2e-6 * float(w.grad.abs().max()), rtol=1e-4)


@pytest.mark.parametrize("with_kl", [False, True], ids=["logprobs", "logprobs and forward KL"])
def test_a_micro_batch_without_loss_positions_gives_zeros(tmp_path, with_kl):
    """A micro-batch whose loss mask is 0 everywhere (its samples all masked: ``truncated: mask``, a stale
    sample) has no position for the head: the pass returns zeros of the micro-batch's length, and a backward
    through them works (it adds nothing), rather than failing on an empty concatenation."""
    from transformers import AutoModelForCausalLM

    from train_node.infer.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "tiny", seed=0)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).requires_grad_(False)
    ids = torch.randint(5, 200, (7,), generator=torch.Generator().manual_seed(2))
    pos, targets, inv_t, mask = torch.arange(7), torch.roll(ids, -1), torch.ones(7), torch.zeros(7)
    logp, kl = _head_pass(policy, ref if with_kl else None, ids, pos, targets, inv_t, mask)
    assert logp.shape == kl.shape == (7,) and float(logp.abs().sum() + kl.abs().sum()) == 0.0
    ((logp + kl) * mask).sum().backward()
    assert all(w.grad is None or float(w.grad.abs().max()) == 0.0 for w in policy.parameters())
