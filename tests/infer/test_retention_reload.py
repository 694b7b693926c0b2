"""Issue 14 item 5 on a real ``spoolrl infer-node`` (CPU engine process) and the trainer's real Publisher:
retention never deletes a version a server serves or is loading, and a server whose reload fails keeps
advertising (and serving) the version it actually has."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc.cli.run import init_run
from hpc.config import load_config
from hpc.fsutil import atomic_write_text
from hpc.paths import RunPaths
from tests.infer.infer_helpers import forward_logprobs, http

REPO = Path(__file__).resolve().parents[2]
FAST = ["inference.engine=cpu", "inference.cpu_threads=1", "inference.policy_poll_s=0.2",
        "inference.heartbeat_s=120", "slurm.infer.gpus_per_node=0"]  # no health check lands in the SIGSTOP window


def _node(paths: RunPaths) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", "infer-node", str(paths.root)], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _wait_endpoint(paths: RunPaths, ok: Callable[[dict[str, Any]], bool], proc: subprocess.Popen[bytes],
                   timeout_s: float = 240) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"infer-node exited {proc.returncode}"
        for f in paths.endpoints.glob("infer-*.json"):
            info = json.loads(f.read_text())
            if ok(info):
                return dict(info)
        time.sleep(0.1)
    raise AssertionError("endpoint condition not reached")


def _serves(url: str, token: str, model_dir: Path, version: int) -> None:
    """A completion's spans name ``version`` and its logprobs are those of ``model_dir``'s weights."""
    status, out = http(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 5, "logprobs": 1,
                                                "return_token_ids": True, "ignore_eos": True, "seed": 3}, token=token)
    choice = out["choices"][0]
    assert status == 200 and choice["weight_versions"] == [{"version": version, "start": 0, "end": 5}]
    ref = forward_logprobs(model_dir, [1, 2, 3], choice["token_ids"])
    assert max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], ref, strict=True)) < 1e-4


def _publisher(paths: RunPaths, model_dir: Path, keep: int) -> tuple[Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM

    from train_node.trainer.publish import Publisher

    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    pub = Publisher(paths, model.config, model_dir, keep=keep, background=False)
    return pub, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _start(tmp_path: Path) -> tuple[RunPaths, subprocess.Popen[bytes], str]:
    paths = RunPaths(tmp_path / "run")
    init_run(str(paths.root), load_config(None, FAST))
    proc = _node(paths)
    return paths, proc, paths.secret.read_text().strip()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0


def test_failed_reload_keeps_advertising_the_served_version(models: dict[str, Path], tmp_path: Path) -> None:
    paths, proc, token = _start(tmp_path)
    try:
        _wait_endpoint(paths, lambda e: e["version"] == 0, proc)
        shutil.copytree(models["b"], paths.policy_version(1))
        atomic_write_text(paths.policy_latest, "1\n")
        info = _wait_endpoint(paths, lambda e: e["version"] == 1, proc)
        broken = paths.policy_version(2)  # complete-looking (config.json) but its weights are garbage
        shutil.copytree(models["a"], broken)
        (broken / "model.safetensors").write_bytes(b"\0" * 1000)
        atomic_write_text(paths.policy_latest, "2\n")
        deadline = time.monotonic() + 120
        while not _metric(paths, "reload_failed"):
            assert time.monotonic() < deadline, "no reload_failed record"
            time.sleep(0.1)
        failed = _metric(paths, "reload_failed")[0]
        assert failed["version"] == 2 and failed["serving"] == 1
        after = _wait_endpoint(paths, lambda e: e["loading"] is None, proc)
        assert after["version"] == 1 and after["server_pid"] == info["server_pid"]  # not restarted, not v2
        _serves(after["url"], token, paths.policy_version(1), 1)
    finally:
        _stop(proc)


def test_retention_keeps_served_and_loading_versions(models: dict[str, Path], tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    init_run(str(paths.root), load_config(None, FAST))
    pub, weights_b = _publisher(paths, models["b"], keep=2)
    pub.publish(weights_b)  # v0: the node starts on it
    proc, token = _node(paths), paths.secret.read_text().strip()
    try:
        _wait_endpoint(paths, lambda e: e["version"] == 0, proc)
        pub.publish(weights_b)  # v1
        info = _wait_endpoint(paths, lambda e: e["version"] == 1 and e["loading"] is None, proc)
        os.kill(info["server_pid"], signal.SIGSTOP)  # the next reload hangs: v2 is "loading" for as long as we want
        try:
            pub.publish(weights_b)  # v2
            _wait_endpoint(paths, lambda e: e["loading"] == 2 and e["version"] == 1, proc)
            for _ in range(3):
                pub.publish(weights_b)  # v3, v4, v5 with keep=2: retention would remove v0..v3
            left = sorted(p.name for p in paths.policy.glob("v*"))
            assert left == ["v000001", "v000002", "v000004", "v000005"], left  # v1 served, v2 loading; v0, v3 free
        finally:
            os.kill(info["server_pid"], signal.SIGCONT)
        done = _wait_endpoint(paths, lambda e: e["version"] == 5 and e["loading"] is None, proc)
        _serves(done["url"], token, paths.policy_version(5), 5)
        pub.publish(weights_b)  # v6: nothing holds v1, v2 any more
        assert sorted(p.name for p in paths.policy.glob("v*")) == ["v000005", "v000006"]
    finally:
        _stop(proc)
    assert not list(paths.endpoints.glob("*.json"))  # endpoint and loading pins gone with the node


def _metric(paths: RunPaths, kind: str) -> list[dict[str, Any]]:
    return [r for f in paths.metrics.glob("infer-*.jsonl") for line in f.read_text().splitlines()
            if (r := json.loads(line))["kind"] == kind]
