"""``trainer.trainable_layers``: train only the top N transformer blocks, the final norm and the head.

Guarantees:
- 0 trains every parameter (nothing is frozen). N > 0 sets ``requires_grad`` false on every parameter
  outside the top N blocks of the decoder's ``layers``, the decoder's final ``norm`` and the output head;
  the engine builds its optimizer from the parameters still trainable, so the frozen ones are neither
  updated nor in the optimizer state. They stay in every checkpoint and published policy (unchanged).
- With tied input and output embeddings (SmolLM2) the head *is* the input embedding: it is trained, through
  the head only. The input embedding's output is detached (a forward hook), so the backward pass stops at
  the lowest trainable block instead of running through every frozen one (which would cost about as much
  as training them all); the shared weight's gradient is the head's.
- A model without that layout (no ``get_decoder().layers`` list, no output head) or with fewer than N
  blocks is refused with a ValueError that names the key and the fix, before DeepSpeed starts.
"""

from __future__ import annotations

import torch


def _decoder(model: torch.nn.Module) -> object:
    get_decoder = getattr(model, "get_decoder", None)
    return get_decoder() if callable(get_decoder) else None


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's list of transformer blocks (``model.get_decoder().layers``, the Llama/Qwen/Mistral layout)."""
    layers = getattr(_decoder(model), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        raise ValueError(f"trainer.trainable_layers: {type(model).__name__} has no list of transformer blocks at "
                         "get_decoder().layers (the Llama/Qwen layout); set trainer.trainable_layers to 0 (train "
                         "every layer)")
    return layers


def _detached(module: torch.nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
    return output.detach()


def train_top_layers(model: torch.nn.Module, n: int) -> int:
    """Freeze everything but the top ``n`` blocks, the final norm and the head (``n`` = 0: nothing); returns the
    number of parameters left trainable."""
    if n == 0:
        return sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = decoder_layers(model)
    if n > len(layers):
        raise ValueError(f"trainer.trainable_layers: {n} but the model has {len(layers)} transformer blocks; "
                         f"give at most {len(layers)} (or 0 for all)")
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        raise ValueError(f"trainer.trainable_layers: {type(model).__name__} has no output head "
                         "(get_output_embeddings() returned nothing); set trainer.trainable_layers to 0")
    keep: list[torch.nn.Module] = [*layers[len(layers) - n:], head]
    norm = getattr(_decoder(model), "norm", None)
    if isinstance(norm, torch.nn.Module):
        keep.append(norm)
    trainable = {id(p) for module in keep for p in module.parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in trainable)
    get_embed = getattr(model, "get_input_embeddings", None)
    embed = get_embed() if callable(get_embed) else None
    if isinstance(embed, torch.nn.Module) and getattr(embed, "weight", None) is getattr(head, "weight", False):
        embed.register_forward_hook(_detached)  # tied: the head's weight trains through the head only
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
