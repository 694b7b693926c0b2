"""The trainer's packed attention (``train_node/trainer/attention.py``): which models get it, that it computes what
``sdpa`` with transformers' block-diagonal mask computes (values and gradients), and what it refuses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from train_node.trainer.attention import FAMILIES, PACKED_SDPA, fits, register, sequence_bounds
from train_node.trainer.engine import load_model


def _tiny(family: str = "qwen2", **kw: Any) -> Any:
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[family]
    if family == "mistral":
        kw.setdefault("sliding_window", None)
    return cls(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, tie_word_embeddings=True, **kw)


def test_fits_only_checked_families_with_plain_causal_full_attention() -> None:
    from transformers import Gemma2Config, GPTNeoXConfig, LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    assert fits(LlamaConfig()) and fits(Qwen2Config()) and fits(Qwen3Config()) and fits(MistralConfig(sliding_window=None))
    assert not fits(MistralConfig(sliding_window=4096))  # a window on every layer
    assert not fits(Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=0))
    assert not fits(Gemma2Config())  # alternating sliding layers and logit softcapping
    assert not fits(GPTNeoXConfig())  # plain causal attention, but a family nobody checked: sdpa with the mask


def test_sequence_bounds_from_restarting_positions() -> None:
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 0, 1, 2, 3]])
    assert sequence_bounds(pos) == [0, 3, 5, 6, 10]
    assert sequence_bounds(torch.arange(7)[None]) == [0, 7]
    assert sequence_bounds(torch.tensor([5, 6, 7, 2, 3])) == [0, 3, 5]  # a restart need not be at 0


def test_load_model_picks_it_and_the_saved_config_does_not_carry_it(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, MistralConfig

    AutoModelForCausalLM.from_config(_tiny()).save_pretrained(str(tmp_path / "qwen"))
    model: Any = load_model(tmp_path / "qwen", "fp32", False)
    assert model.config._attn_implementation == PACKED_SDPA
    model.save_pretrained(str(tmp_path / "saved"))
    assert PACKED_SDPA not in (tmp_path / "saved" / "config.json").read_text()  # servers load published weights as is
    windowed = MistralConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, sliding_window=16)
    AutoModelForCausalLM.from_config(windowed).save_pretrained(str(tmp_path / "mistral"))
    windowed_model: Any = load_model(tmp_path / "mistral", "fp32", False)
    assert windowed_model.config._attn_implementation == "sdpa"


def _packed_row(lengths: list[int], seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(3, 300, sum(lengths)))[None]
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    return ids, pos


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_same_logits_and_gradients_as_sdpa_with_the_packed_mask(family: str) -> None:
    """Forward and backward of one packed row of five sequences (one of a single token), for every family the trainer
    gives the packed attention: the per-sequence attention against transformers' ``sdpa`` with its block-diagonal mask,
    same weights. A sequence attending past its own start (the bug packing must not have) would change the logits of
    every sequence after the first."""
    from transformers import AutoModelForCausalLM

    register()
    assert fits(_tiny(family))
    models = {}
    for name in ("sdpa", PACKED_SDPA):
        torch.manual_seed(0)
        models[name] = AutoModelForCausalLM.from_config(_tiny(family), dtype=torch.float64,
                                                        attn_implementation=name)
    ids, pos = _packed_row([17, 1, 40, 9, 33])
    logits, grads = {}, {}
    for name, model in models.items():
        out = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        (out.float().logsumexp(-1).sum() + out[..., 5].sum()).backward()
        logits[name] = out.detach()
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    assert torch.allclose(logits["sdpa"], logits[PACKED_SDPA], atol=1e-10)
    assert grads["sdpa"].keys() == grads[PACKED_SDPA].keys() and len(grads["sdpa"]) > 10
    for n, g in grads["sdpa"].items():
        assert torch.allclose(g, grads[PACKED_SDPA][n], atol=1e-9), n
    # and the packing is real: the whole row as one sequence gives other logits after the first sequence
    whole = models[PACKED_SDPA](input_ids=ids, position_ids=torch.arange(ids.shape[1])[None], use_cache=False).logits
    assert torch.allclose(whole[0, :17], logits[PACKED_SDPA][0, :17], atol=1e-10)
    assert not torch.allclose(whole[0, 18:], logits[PACKED_SDPA][0, 18:], atol=1e-3)


def test_batches_and_refuses_what_it_cannot_honour() -> None:
    """Unpadded batches equal sdpa's; a padded one through the packed attention would silently attend to padding:
    refused, naming the fix."""
    from transformers import AutoModelForCausalLM

    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(_tiny(), attn_implementation=PACKED_SDPA)
    torch.manual_seed(0)
    dense = AutoModelForCausalLM.from_config(_tiny(), attn_implementation="sdpa")
    ids = torch.randint(3, 300, (2, 6))
    # an unpadded batch (what test_learns samples with) is causal attention per row, as under sdpa
    assert torch.allclose(model(input_ids=ids, use_cache=False).logits, dense(input_ids=ids, use_cache=False).logits,
                          atol=1e-5)
    packed_pos = torch.tensor([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 4, 5]])  # one row packs two sequences
    assert torch.allclose(model(input_ids=ids, position_ids=packed_pos, use_cache=False).logits,
                          dense(input_ids=ids, position_ids=packed_pos, use_cache=False).logits, atol=1e-5)
    padded = torch.ones(1, 6, dtype=torch.long)
    padded[0, :2] = 0
    with pytest.raises(RuntimeError, match="padding"):
        model(input_ids=ids[:1], attention_mask=padded, use_cache=False)
    # a mask that masks nothing is fine
    model(input_ids=ids[:1], attention_mask=torch.ones(1, 6, dtype=torch.long), use_cache=False)
