"""Harness gateway benchmark, two measurements in one run:

1. **Per-call overhead**: latency through the gateway (its Unix socket, the OpenAI wire format, rendering +
   prefix merging + parsing + recording) against calling the backend directly with the same token prompt
   (the built-in agent's path), side by side, call by call.
2. **A harness episode's wall time split** into LLM (the session's time waiting for the backend), gateway
   (the gateway's own time per call: HTTP, parsing, rendering, recording) and the rest (tools + harness:
   the sandbox's start, the harness's own code and its tool calls, the loopback relay), for the example
   harness (``examples/harness``, installed by ``spoolrl harness install``) in a bwrap sandbox against a
   scripted backend (``--harness-latency-s`` per completion) answering ``--harness-turns`` bash calls then
   ``submit``; the sandbox start alone (``true`` launched the same way) is measured beside it.

    .venv/bin/python scripts/bench_gateway.py [--episodes 8] [--turns 16] [--latency-s 0] [--model DIR]
        [--harness-episodes 3] [--harness-turns 4] [--harness-latency-s 0.5] [--harness-prefix DIR]

The backend is the stand-in (rollout_node/service/standin.py: the token-ID ``/v1/completions``
protocol, a fixed reply with a tool call, ``--latency-s`` per completion) on loopback, reached by the
real InferenceClient in both arms. Each episode is a harness that resends its whole history each turn
(a tool call answered by a tool result of ~100 tokens), so later calls render longer conversations.
Each gateway call is followed by a direct call with the prompt the gateway sent. Prints one JSON line per arm, the per-call
overhead (gateway minus direct, paired), one JSON line for the harness episodes (``--harness-episodes 0``: none;
without ``--harness-prefix`` the example harness is installed into a temporary directory first), and Markdown tables.
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
from rollout_node.agent.policy import Completion, SamplingParams  # noqa: E402
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
    with tempfile.TemporaryDirectory(prefix="bench-gw-", ignore_cleanup_errors=True) as name:
        tmp = Path(name)
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


HARNESS_COMMAND = "spoolrl-example-agent --max-turns 64"
HARNESS_TOOL_CALLS = ("ls -la", "grep -rn spoolrl . | head -20", "python3 -c 'print(sum(range(10**5)))'",
                      "git status --short")


class SlowScripted:
    """The scripted backend (no LLM here) answering after ``latency_s``: the LLM time of the episode."""

    def __init__(self, inner: Any, latency_s: float) -> None:
        self.inner, self.latency_s = inner, latency_s

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        time.sleep(self.latency_s)
        return self.inner.generate(prompt_ids, sampling)  # type: ignore[no-any-return]


def install_example(tmp: Path) -> Path:
    from hpc.config import load_config
    from rollout_node.pipeline.harness_install import install

    prefix = tmp / "example-agent"
    install(str(ROOT / "examples" / "harness"), prefix, load_config(None, []).sandbox)
    return prefix


def harness_episodes(episodes: int, turns: int, latency_s: float, prefix: Path, model_dir: Path) -> dict[str, Any]:
    """Wall time of ``episodes`` example-harness episodes, split into LLM, gateway and the rest."""
    import subprocess

    from hpc.config import load_config
    from hpc.config.rollout import HarnessConfig
    from rollout_node.agent.toolcall import format_tool_call
    from rollout_node.pipeline.agentscript import bash
    from rollout_node.pipeline.harness import ScriptedBackend, run_harness
    from rollout_node.sandbox import open_sandbox

    template = ChatTemplate.from_model_dir(model_dir)
    with tempfile.TemporaryDirectory(prefix="bench-gw-harness-", ignore_cleanup_errors=True) as name:
        tmp = Path(name)
        cfg = load_config(None, [f"sandbox.scratch_dir={tmp / 'scratch'}", "rollout.policy=harness",
                                 f"rollout.harness.prefix={prefix}", f"rollout.harness.command={HARNESS_COMMAND}"])
        replies = [bash(HARNESS_TOOL_CALLS[i % len(HARNESS_TOOL_CALLS)]) for i in range(turns)]
        replies.append(format_tool_call("submit", {}))
        rows: list[dict[str, float]] = []
        sampling = GatewaySampling(temperature=1.0, max_tokens=1 << 20, max_new_tokens=256)
        with Gateway(tmp / "gw.sock") as gw:
            for e in range(episodes):
                work = tmp / f"work{e}"
                work.mkdir()
                (work / "README.md").write_text("spoolrl bench\n" * 50)
                subprocess.run(["git", "init", "-q"], cwd=work, check=True)
                backend = SlowScripted(ScriptedBackend(template, replies, logprob_kind="processed"), latency_s)
                with open_sandbox(cfg.sandbox, work) as sb:
                    start = run_harness(sb, HarnessConfig(command="true", prefix=str(prefix)),
                                        key="-", socket_path=gw.socket_path, problem="noop", stop=lambda: False,
                                        timeout_s=120.0)
                    session = gw.open_session(f"harness-{e}", backend, template, sampling)
                    t0 = time.perf_counter()
                    result = run_harness(sb, cfg.rollout.harness, key=session.key, socket_path=session.socket_path,
                                         problem="Look around the repository, then submit.", stop=lambda: False,
                                         timeout_s=600.0)
                    wall = time.perf_counter() - t0
                    trace = session.close()
                assert result.exit_code == 0 and trace.calls == turns + 1, (result.exit_code, trace.calls, result.output)
                rows.append({"wall_s": wall, "llm_s": trace.llm_s, "gateway_s": trace.gateway_s,
                             "rest_s": wall - trace.llm_s - trace.gateway_s, "sandbox_start_s": start.duration_s,
                             "calls": float(trace.calls), "segments": float(len(trace.segments))})
        mean = {k: round(statistics.fmean(r[k] for r in rows), 4) for k in rows[0]}
        return {"arm": "harness_episode", "episodes": episodes, "turns": turns, "latency_s": latency_s, **mean,
                "gateway_ms_per_call": round(1e3 * mean["gateway_s"] / mean["calls"], 3)}


def harness_table(h: dict[str, Any]) -> str:
    wall = h["wall_s"]
    rows = ["| part of the episode's wall time | s (mean) | share |", "|---|---:|---:|"]
    for label, key in (("LLM (backend)", "llm_s"), ("gateway (own time)", "gateway_s"),
                       ("tools + harness (the rest)", "rest_s"), ("whole episode", "wall_s")):
        rows.append(f"| {label} | {h[key]:.3f} | {100 * h[key] / wall:.1f} % |")
    rows.append(f"| (sandbox start alone, not in the episode) | {h['sandbox_start_s']:.3f} | |")
    return "\n".join(rows)


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
    p.add_argument("--harness-episodes", type=int, default=3, help="example-harness episodes (0: none)")
    p.add_argument("--harness-turns", type=int, default=4, help="bash calls per harness episode (then submit)")
    p.add_argument("--harness-latency-s", type=float, default=0.5, help="the scripted backend's latency per call")
    p.add_argument("--harness-prefix", type=Path, default=None,
                   help="an install of examples/harness (default: install it into a temporary directory)")
    args = p.parse_args(argv)
    if args.episodes < 1 or args.turns < 1 or args.harness_episodes < 0 or args.harness_turns < 1:
        p.error("--episodes, --turns and --harness-turns must be >= 1, --harness-episodes >= 0")
    model = args.model or cached_tiny_model()
    result = run(args.episodes, args.turns, args.latency_s, model)
    for arm in ("direct", "gateway", "overhead"):
        print(json.dumps(result[arm]))
    print(json.dumps({k: v for k, v in result.items() if k not in ("direct", "gateway", "overhead")}))
    print(table(result))
    if args.harness_episodes:
        with tempfile.TemporaryDirectory(prefix="bench-gw-install-", ignore_cleanup_errors=True) as name:
            prefix = args.harness_prefix or install_example(Path(name))
            result["harness"] = harness_episodes(args.harness_episodes, args.harness_turns, args.harness_latency_s,
                                                 prefix, model)
        print(json.dumps(result["harness"]))
        print(harness_table(result["harness"]))
    return result


if __name__ == "__main__":
    main()
