"""``trainer.trainable_layers``: which parameters stay trainable, and the clear refusals (no DeepSpeed here)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from hpc.config import config_from_dict
from hpc.errors import ConfigError
from train_node.trainer.layers import train_top_layers

from .helpers import tiny_model

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def _model(tmp_path: Path) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    tiny_model(tmp_path / "m")
    return AutoModelForCausalLM.from_pretrained(str(tmp_path / "m"))


def test_zero_trains_everything_and_n_keeps_the_top_blocks(tmp_path: Path) -> None:
    model = _model(tmp_path)
    total = sum(p.numel() for p in model.parameters())
    assert train_top_layers(model, 0) == total and all(p.requires_grad for p in model.parameters())
    n = train_top_layers(model, 1)
    trainable = sorted(k for k, p in model.named_parameters() if p.requires_grad)
    assert 0 < n < total and n == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert any(k.startswith("model.layers.1.") for k in trainable) and "model.norm.weight" in trainable
    assert not any(k.startswith("model.layers.0.") for k in trainable)
    assert "model.embed_tokens.weight" in trainable  # tied: the head is the input embedding
    assert train_top_layers(model, 2) == total  # every block: with the tied head, every parameter


def test_tied_head_trains_through_the_head_only_so_backward_stops_at_the_top_blocks(tmp_path: Path) -> None:
    model = _model(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert model(input_ids=ids, output_hidden_states=True).hidden_states[0].requires_grad  # before: all the way down
    train_top_layers(model, 1)
    out = model(input_ids=ids, output_hidden_states=True)
    assert not out.hidden_states[0].requires_grad and not out.hidden_states[1].requires_grad  # below block 1
    assert out.hidden_states[2].requires_grad
    out.logits.sum().backward()
    embed = model.get_input_embeddings().weight
    assert embed is model.get_output_embeddings().weight and embed.grad is not None and embed.grad.abs().sum() > 0
    assert all(p.grad is None for p in model.model.layers[0].parameters())


def test_refuses_more_layers_than_the_model_has_and_a_model_without_blocks(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"trainer.trainable_layers: 3 but the model has 2 transformer blocks"):
        train_top_layers(_model(tmp_path), 3)
    with pytest.raises(ValueError, match=r"trainer.trainable_layers: Sequential has no list of transformer blocks"):
        train_top_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)), 1)


def test_config_refuses_a_negative_count() -> None:
    with pytest.raises(ConfigError, match="trainer.trainable_layers"):
        config_from_dict({"trainer": {"trainable_layers": -1}})
