"""A tiny causal LM + tokenizer in Hugging Face format, built locally (nothing from a hub).

Guarantees:
- Deterministic: the same arguments on the same Python/transformers give the same tokenizer and
  bit-identical weights (random init from ``seed``); a different seed gives different weights.
- The tokenizer is a byte-level BPE trained on the running interpreter's stdlib sources, wrapped in
  ``PreTrainedTokenizerFast`` with a ChatML chat template and the specials ``<|endoftext|>`` (eos and
  pad), ``<|im_start|>``, ``<|im_end|>``.
- The model is a Qwen2 with UNTIED embeddings and ``lm_head`` scaled x5: a random model with tied,
  scaled embeddings just repeats its last input token; this one samples varied tokens (logit std ~1.6).
  It is the demo's base (warm-started by ``spoolrl demo``); what it takes to make it read a task
  statement is in ``docs/pick_learning.md``.
- Output directories appear atomically (built in a temporary sibling, then renamed) and builds are
  cached under ``$SPOOLRL_CACHE`` (default ``~/.cache/spoolrl``), keyed by every argument.
- vLLM (CPU and GPU) serves the result: fp32 safetensors, head_dim 64, max_position_embeddings 2048.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hpc.errors import UsageError
from hpc.fsutil import tmp_name

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MARKER = "spoolrl_tiny_model.json"
BUILDER_VERSION = 1


@dataclasses.dataclass(frozen=True)
class TinySpec:
    """Everything that determines the files of a tiny model."""

    seed: int = 0
    vocab_size: int = 4000
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_position_embeddings: int = 2048
    lm_head_scale: float = 5.0

    def key(self) -> str:
        import transformers

        ident = dict(dataclasses.asdict(self), builder=BUILDER_VERSION, python=sys.version_info[:3],
                     transformers=transformers.__version__)
        return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def cache_root() -> Path:
    return Path(os.environ.get("SPOOLRL_CACHE") or Path.home() / ".cache" / "spoolrl")


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, vocab_size: int = 4000, use_cache: bool = True,
                     **overrides: Any) -> Path:
    """Build (or reuse) a tiny model in ``out_dir``; returns its absolute path.

    ``overrides`` are further :class:`TinySpec` fields (hidden_size, num_layers, ...). An ``out_dir``
    that already holds the same build is reused; one that holds anything else is an error.
    """
    spec = TinySpec(seed=seed, vocab_size=vocab_size, **overrides)
    out = Path(out_dir).absolute()
    if _is_build_of(out, spec):
        return out
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out} exists and is not an empty directory; pick a new directory for the tiny model")
    src = _cached_build(spec) if use_cache else None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(out)
    shutil.rmtree(tmp, ignore_errors=True)
    if src is not None:
        shutil.copytree(src, tmp)
    else:
        _build_into(tmp, spec)
    if out.exists():
        out.rmdir()  # empty (checked above); rename cannot replace a directory otherwise
    os.replace(tmp, out)
    return out


def cached_tiny_model(seed: int = 0, **overrides: Any) -> Path:
    """The cache's own copy of a tiny model (built on a miss); read it, never write into it."""
    return _cached_build(TinySpec(seed=seed, **overrides))


def _is_build_of(path: Path, spec: TinySpec) -> bool:
    try:
        return json.loads((path / MARKER).read_text()).get("key") == spec.key()
    except (OSError, ValueError):
        return False


def _cached_build(spec: TinySpec) -> Path:
    """The cached copy of ``spec`` (built on a miss; concurrent builders race harmlessly)."""
    target = cache_root() / "tiny-models" / spec.key()
    if _is_build_of(target, spec):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(target)
    shutil.rmtree(tmp, ignore_errors=True)
    _build_into(tmp, spec)
    try:
        os.replace(tmp, target)
    except OSError:  # another process published it first (a non-empty target dir cannot be replaced)
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_into(path: Path, spec: TinySpec) -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = train_tokenizer(spec.vocab_size, spec.max_position_embeddings)
    model = _random_model(spec, tok)
    path.mkdir(parents=True)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    n_params = sum(p.numel() for p in model.parameters())
    marker = {"key": spec.key(), "spec": dataclasses.asdict(spec), "params": n_params}
    (path / MARKER).write_text(json.dumps(marker, indent=1, sort_keys=True) + "\n")


def _stdlib_sources() -> list[str]:
    """Top-level stdlib modules that are valid UTF-8 (BPE training raises on anything else)."""
    std = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for p in sorted(std.glob("*.py")):
        try:
            p.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        files.append(str(p))
    return files


def train_tokenizer(vocab_size: int = 4000, max_len: int = 2048) -> Any:
    """A byte-level BPE trained on stdlib sources, as a PreTrainedTokenizerFast (~1 s)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(_stdlib_sources(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=list(SPECIALS[1:]), chat_template=CHAT_TEMPLATE,
                                   model_max_length=max_len)


def _random_model(spec: TinySpec, tok: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=spec.hidden_size, intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=spec.num_layers, num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads, max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    # fork_rng: building a model must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(spec.lm_head_scale)
    return model.eval()

