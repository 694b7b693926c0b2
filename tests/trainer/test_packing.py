"""Packing and rank balancing (pure), and packed forward == separate forwards (tiny model, no DeepSpeed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from train_node.trainer.attention import PACKED_SDPA, register
from train_node.trainer.loss import token_logprobs
from train_node.trainer.packing import Sample, build_micro_batch, plan_step


def _samples(n: int, seed: int = 0, lo: int = 5, hi: int = 60) -> list[Sample]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        length = int(rng.integers(lo, hi))
        mask = np.zeros(length, dtype=np.int8)
        mask[length // 3:] = 1
        out.append(Sample(f"t{i}", rng.integers(3, 300, length).astype(np.int32), mask,
                          np.where(mask == 1, -1.5, 0).astype(np.float32), float(rng.normal()), 1.0))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_sample_once_and_equal_micro_batch_counts(world: int) -> None:
    samples = _samples(37)
    plan = plan_step(samples, world, micro_batch_tokens=128)
    ids = [t for mbs in plan.per_rank for mb in mbs for t in mb.trajectory_ids]
    assert sorted(ids) == sorted(s.trajectory_id for s in samples)
    assert len({len(mbs) for mbs in plan.per_rank}) == 1
    for mbs in plan.per_rank:
        for mb in mbs:
            assert mb.num_tokens <= 128
    assert plan.total_tokens == sum(s.num_tokens for s in samples)
    assert plan.total_loss_tokens == sum(int(mb.mask.sum()) for mbs in plan.per_rank for mb in mbs)
    assert 0 < plan.packing_efficiency <= 1


def test_balancing_by_tokens() -> None:
    samples = _samples(64, seed=3)
    loads = plan_step(samples, 4, micro_batch_tokens=512).rank_tokens
    assert max(loads) - min(loads) <= max(s.num_tokens for s in samples)


def test_over_long_sample_gets_its_own_micro_batch() -> None:
    samples = _samples(3, lo=10, hi=20) + _samples(1, seed=9, lo=300, hi=301)
    plan = plan_step(samples, 1, micro_batch_tokens=64)
    big = [mb for mb in plan.per_rank[0] if mb.num_tokens >= 300]
    assert len(big) == 1 and big[0].trajectory_ids == ["t0"] and len(big[0].input_ids) == 300


def test_alignment_targets_mask_behaviour() -> None:
    ids = np.array([5, 6, 7, 8], dtype=np.int32)
    mask = np.array([0, 0, 1, 1], dtype=np.int8)
    lp = np.array([0, 0, -0.5, -0.25], dtype=np.float32)
    mb = build_micro_batch([Sample("a", ids, mask, lp, 2.0, 0.5), Sample("b", ids[:3], mask[:3], lp[:3], -1.0)])
    assert mb.position_ids.tolist() == [0, 1, 2, 3, 0, 1, 2]
    # position j predicts token j+1 of the same sequence; the last position of a sequence predicts nothing
    assert mb.targets.tolist() == [6, 7, 8, 0, 6, 7, 0]
    assert mb.mask.tolist() == [0, 1, 1, 0, 0, 1, 0]
    assert mb.behaviour_logprobs.tolist() == [0, -0.5, -0.25, 0, 0, -0.5, 0]
    assert mb.advantages.tolist() == [2, 2, 2, 2, -1, -1, -1]
    assert mb.inv_temperature.tolist() == [2, 2, 2, 2, 1, 1, 1]


@pytest.mark.parametrize("attention", ["sdpa", PACKED_SDPA])
def test_packed_forward_equals_separate_forwards(attention: str) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(
        Qwen2Config(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, tie_word_embeddings=True), dtype=torch.float32,
        attn_implementation=attention).eval()
    samples = _samples(5, seed=1)
    mb = build_micro_batch(samples)
    with torch.no_grad():
        out = model(input_ids=torch.from_numpy(mb.input_ids)[None], position_ids=torch.from_numpy(mb.position_ids)[None],
                    use_cache=False)
        packed = token_logprobs(out.logits[0], torch.from_numpy(mb.targets), torch.from_numpy(mb.inv_temperature))
        start = 0
        for s in samples:
            one = build_micro_batch([s])
            o = model(input_ids=torch.from_numpy(one.input_ids)[None])
            alone = token_logprobs(o.logits[0], torch.from_numpy(one.targets), torch.from_numpy(one.inv_temperature))
            got = packed[start:start + s.num_tokens]
            assert torch.allclose(got, alone, atol=1e-5), (s.trajectory_id, float((got - alone).abs().max()))
            start += s.num_tokens


def test_minibatches_split_every_sample_once_each_with_loss_tokens() -> None:
    """algorithm.minibatches: balanced by loss tokens; a sample without loss tokens never makes a minibatch of its
    own; k above the samples that have loss tokens gives one minibatch per such sample."""
    from train_node.trainer.packing import plan_minibatches, split_minibatches

    samples = _samples(11, seed=4)
    masked = Sample("masked", np.arange(3, 20, dtype=np.int32), np.zeros(17, dtype=np.int8),
                    np.zeros(17, dtype=np.float32), 0.5)
    parts = split_minibatches([*samples, masked], 3)
    assert len(parts) == 3 and all(sum(s.num_loss_tokens for s in p) > 0 for p in parts)
    assert sorted(s.trajectory_id for p in parts for s in p) == sorted([s.trajectory_id for s in samples] + ["masked"])
    loads = [sum(s.num_loss_tokens for s in p) for p in parts]
    assert max(loads) - min(loads) <= max(s.num_loss_tokens for s in samples)
    assert len(split_minibatches([samples[0], masked], 4)) == 1
    assert [len(p.per_rank) for p in plan_minibatches(samples, 2, 2, 128)] == [2, 2]
    assert split_minibatches(samples, 1) == [samples]
