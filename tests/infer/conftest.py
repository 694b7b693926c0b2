"""Fixtures for the inference tests: tiny models and running servers of both engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.infer.infer_helpers import SECRET, Running, vllm_gpus, vllm_unavailable, vllm_venv, wait_healthy
from train_node.infer.servers import CpuServer, ServerSpec, VllmServer
from train_node.infer.tiny import build_tiny_model


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two tiny checkpoints with different weights (seed 0 = 'a', seed 1 = 'b')."""
    root = tmp_path_factory.mktemp("models")
    return {"a": build_tiny_model(root / "a", seed=0), "b": build_tiny_model(root / "b", seed=1)}


def _spec(tmp: Path, secret_file: Path) -> ServerSpec:
    return ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0, secret_file=secret_file,
                      log_path=tmp / "server.log", threads=1, max_batch=16,
                      vllm_python=str(vllm_venv() / "bin" / "python"), cpu_kvcache_gb=1, dtype="float32",
                      gpus=vllm_gpus())


@pytest.fixture(scope="module", params=["cpu", pytest.param("vllm", marks=pytest.mark.vllm)])
def server(request: pytest.FixtureRequest, models: dict[str, Path],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """A running server of each engine on model 'a' (version 0), started through our own handles."""
    engine = request.param
    if engine == "vllm" and (why := vllm_unavailable()):
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp(f"srv-{engine}")
    secret_file = tmp / "secret"
    secret_file.write_text(SECRET + "\n")
    handle = (VllmServer if engine == "vllm" else CpuServer)(_spec(tmp, secret_file))
    handle.start(models["a"], 0)
    try:
        wait_healthy(handle, 480.0 if engine == "vllm" else 180.0)
        assert handle.url is not None
        yield Running(engine, handle.url, handle, SECRET, {0: models["a"]})
    finally:
        handle.stop()
