"""Harness gateway benchmark: per-call latency through the gateway (its Unix socket, the OpenAI wire
format, rendering + prefix merging + parsing + recording) against calling the backend directly with
the same token prompt (the built-in agent's path), side by side in one run.

    .venv/bin/python scripts/bench_gateway.py [--episodes 8] [--turns 16] [--latency-s 0] [--model DIR]

The backend is the stand-in (rollout_node/service/standin.py: the token-ID ``/v1/completions``
protocol, a fixed reply with a tool call, ``--latency-s`` per completion) on loopback, reached by the
real InferenceClient in both arms. Each episode is a harness that resends its whole history each turn
(a tool call answered by a tool result of ~100 tokens), so later calls render longer conversations.
Each gateway call is followed by a direct call with the prompt the gateway sent. Prints one JSON line per arm, the per-call
overhead (gateway minus direct, paired), and a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "gateway")]

from gw_helpers import TOOLS, RecordingBackend  # noqa: E402

from rollout_node.agent.client import InferenceClient  # noqa: E402
from rollout_node.agent.http import HTTPTransport  # noqa: E402
from rollout_node.agent.policy import SamplingParams  # noqa: E402
from rollout_node.agent.template import ChatTemplate  # noqa: E402
from rollout_node.gateway import Gateway, GatewaySampling  # noqa: E402
from train_node.infer.tiny import cached_tiny_model  # noqa: E402

REPLY = 'Checking.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call><|im_end|>'
OBSERVATION = "\n".join(f"-rw-r--r-- 1 user user {100 + i} Dec  5 12:00 file_{i}.py" for i in range(8))


def pct(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summary(name: str, xs: Sequence[float]) -> dict[str, Any]:
    ms = [x * 1e3 for x in xs]
    return {"arm": name, "calls": len(ms), "p50_ms": round(pct(ms, 0.5), 3), "p95_ms": round(pct(ms, 0.95), 3),
            "mean_ms": round(statistics.fmean(ms), 3)}


def run(episodes: int, turns: int, latency_s: float, model_dir: Path) -> dict[str, Any]:
    template = ChatTemplate.from_model_dir(model_dir)
    tmp = Path(tempfile.mkdtemp(prefix="bench-gw-"))
    backend = RecordingBackend(tmp / "record.jsonl", template.encode(REPLY), latency_s)
    client = InferenceClient([backend.url], seed=0)
    direct_s: list[float] = []
    gateway_s: list[float] = []
    internal_s: list[float] = []
    segments = 0
    sampling = SamplingParams(max_tokens=64, temperature=1.0, stop_token_ids=tuple(template.stop_token_ids))
    with Gateway(tmp / "gw.sock") as gw:
        for e in range(episodes):
            key = f"bench-{e}"
            session = gw.open_session(key, client.session(key), template,
                                      GatewaySampling(temperature=1.0, max_tokens=1 << 16))
            direct = client.session(key + "-direct")
            http = HTTPTransport(f"unix://{session.socket_path}", timeout_s=120, token=session.key)
            messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."},
                                              {"role": "user", "content": f"Fix the failing test of repo {e}."}]
            for _turn in range(turns):
                body = {"model": "policy", "messages": messages, "tools": TOOLS, "max_tokens": 64}

                t0 = time.perf_counter()
                answer = http.request("POST", "/v1/chat/completions", body)
                gateway_s.append(time.perf_counter() - t0)
                prompt = backend.records()[-1]["prompt"]  # the very prompt the gateway just sent
                t0 = time.perf_counter()
                direct.generate(prompt, sampling)
                direct_s.append(time.perf_counter() - t0)
                message = answer["choices"][0]["message"]
                messages.append(message)
                for call in message.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": OBSERVATION})
            http.close()
            trace = session.close()
            segments += len(trace.segments)
            internal_s.append(trace.gateway_s / max(trace.calls, 1))
    client.close()
    backend.close()
    paired = [g - d for g, d in zip(gateway_s, direct_s, strict=True)]
    return {"episodes": episodes, "turns": turns, "latency_s": latency_s, "segments_per_episode": segments / episodes,
            "direct": summary("direct", direct_s), "gateway": summary("gateway", gateway_s),
            "overhead": summary("overhead", paired),
            "gateway_internal_ms_per_call": round(statistics.fmean(internal_s) * 1e3, 3)}


def table(r: dict[str, Any]) -> str:
    rows = ["| path | calls | p50 ms | p95 ms | mean ms |", "|---|---:|---:|---:|---:|"]
    for arm in ("direct", "gateway", "overhead"):
        s = r[arm]
        rows.append(f"| {arm} | {s['calls']} | {s['p50_ms']} | {s['p95_ms']} | {s['mean_ms']} |")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--turns", type=int, default=16, help="calls per episode (the history grows each call)")
    p.add_argument("--latency-s", type=float, default=0.0, help="the stand-in backend's latency per completion")
    p.add_argument("--model", type=Path, default=None, help="HF model dir for the tokenizer (default: the tiny model)")
    args = p.parse_args(argv)
    if args.episodes < 1 or args.turns < 1:
        p.error("--episodes and --turns must be >= 1")
    result = run(args.episodes, args.turns, args.latency_s, args.model or cached_tiny_model())
    for arm in ("direct", "gateway", "overhead"):
        print(json.dumps(result[arm]))
    print(json.dumps({k: v for k, v in result.items() if k not in ("direct", "gateway", "overhead")}))
    print(table(result))
    return result


if __name__ == "__main__":
    main()
