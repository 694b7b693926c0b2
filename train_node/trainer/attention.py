"""Attention over a packed micro-batch, one sequence at a time.

The trainer packs several sequences into one row (``trainer.micro_batch_tokens``) with ``position_ids`` that restart
at each sequence. Under transformers' ``sdpa`` that row gets a dense ``[T, T]`` block-diagonal mask, so attention
costs ``T^2`` for the row however short its sequences are (a micro-batch of 16 episodes of 340 tokens pays 16 times
the attention its episodes need).

``packed_sdpa_attention`` is registered with transformers as :data:`PACKED_SDPA`: it finds the sequences from the
``position_ids`` the decoder layers pass to every attention call and runs causal
``scaled_dot_product_attention`` on each alone, ``sum(L_i^2)`` instead of ``T^2``; the linear layers still see the
whole packed row. No mask is built for it (its mask function returns None). It is the same attention, only cheaper:
:func:`train_node.trainer.engine.load_model` picks it for the model families whose attention it was checked against
(:data:`FAMILIES`, ``tests/trainer/test_attention.py``) when every layer is plain causal full attention (:func:`fits`),
and ``sdpa`` for the rest (other families; sliding windows), where the mask stays.
"""

from __future__ import annotations

from typing import Any

import torch

PACKED_SDPA = "spoolrl_packed_sdpa"
# transformers model types whose decoder layers pass position_ids to the attention function and whose logits and
# gradients under PACKED_SDPA were checked equal to sdpa's with the packed mask (tests/trainer/test_attention.py)
FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def sequence_bounds(position_ids: torch.Tensor) -> list[int]:
    """Start offsets of the sequences packed in a ``[1, T]`` (or ``[T]``) ``position_ids`` row, then ``T``: a sequence
    starts where the position does not follow the one before (the first token, and every restart)."""
    pos = position_ids.reshape(-1)
    restarts = (torch.diff(pos) != 1).nonzero().reshape(-1) + 1
    return [0, *restarts.tolist(), int(pos.shape[0])]


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          **kwargs: Any) -> tuple[torch.Tensor, None]:
    """Causal attention of each packed sequence alone; ``query`` ``[B, H, T, D]``, ``key``/``value`` ``[B, Hkv, T, D]``;
    returns ``[B, T, H, D]`` as transformers' attention functions do. Rows without a restart (an unpadded batch of
    single sequences) take one causal call together."""
    position_ids = kwargs.get("position_ids")
    if position_ids is None or attention_mask is not None or key.shape[2] != query.shape[2]:
        raise RuntimeError(
            f"{PACKED_SDPA}: expected packed rows with their position_ids and no cache or mask (got batch "
            f"{query.shape[0]}, query length {query.shape[2]}, key length {key.shape[2]}, position_ids "
            f"{'missing' if position_ids is None else 'given'}, mask {'given' if attention_mask is not None else 'none'})"
            f"; {type(module).__name__} does not pass what the trainer's packed attention needs: load this model with "
            f"attn_implementation='sdpa'")
    if not getattr(module, "is_causal", True):
        raise RuntimeError(f"{PACKED_SDPA}: {type(module).__name__} is not causal; load it with attn_implementation="
                           f"'sdpa'")
    gqa = query.shape[1] != key.shape[1]

    def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout, scale=scaling,
                                                                is_causal=True, enable_gqa=gqa)

    pos = position_ids.expand(query.shape[0], -1)
    rows = [sequence_bounds(p) for p in pos]
    if all(len(b) == 2 for b in rows):
        out = causal(query, key, value)
    else:
        out = torch.cat([torch.cat([causal(query[i:i + 1, :, s:e], key[i:i + 1, :, s:e], value[i:i + 1, :, s:e])
                                    for s, e in zip(b, b[1:], strict=False)], dim=2) for i, b in enumerate(rows)])
    return out.transpose(1, 2).contiguous(), None


def _no_mask(*_args: Any, attention_mask: torch.Tensor | None = None, **_kwargs: Any) -> None:
    """No ``[T, T]`` mask: :func:`packed_sdpa_attention` finds the sequences itself. A padding mask cannot be
    honoured that way, so one that masks anything is refused rather than dropped."""
    if attention_mask is not None and not bool(attention_mask.all()):
        raise RuntimeError(f"{PACKED_SDPA}: the trainer's packed attention takes unpadded rows, and this call's "
                           f"padding mask masks tokens; load this model with attn_implementation='sdpa' for padded "
                           f"batches")
    return None


def fits(config: Any) -> bool:
    """Whether a model with this config is of a checked family (:data:`FAMILIES`) and every layer is plain causal
    full attention, so that :func:`packed_sdpa_attention` computes exactly what ``sdpa`` with transformers' packed
    mask does."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    if getattr(cfg, "model_type", None) not in FAMILIES:
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    if getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "is_encoder_decoder", False):
        return False
    sliding = getattr(cfg, "use_sliding_window", getattr(cfg, "sliding_window", None) is not None)
    return not sliding


def register() -> str:
    """Register :data:`PACKED_SDPA` with transformers (idempotent) and return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, _no_mask)
    return PACKED_SDPA
