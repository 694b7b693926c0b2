#!/usr/bin/env python3
"""What one EVAL per distinct diff of a group (``rollout.eval_dedup``) buys the demo: the same ``spoolrl demo``
run (same seed, steps and warm start) with the setting on and off, one after the other, on this machine.

Both arms are the whole loop (engine, agent, bwrap sandboxes, EVAL, spool, DeepSpeed, reloads). Printed per
arm: seconds per trainer step (median interval from step 2 on: the first step includes start-up), episodes
per minute, the share of episodes whose tests actually ran, the mean reward; then the ratio off/on of the
seconds per step. One JSON line per arm and one summary line on stdout.

    .venv/bin/python scripts/bench_eval_dedup.py [--steps 8] [--seed 0] [--out DIR] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_learning import run_arm  # noqa: E402  (puts the project root on sys.path)

from hpc.metrics import read_metrics  # noqa: E402


def dedup_figures(run: Path) -> dict[str, Any]:
    steps = sorted({int(r["step"]): r for r in read_metrics(run, "train_step")}.items())
    times = [r["t"] for _, r in steps]
    episodes = [e for e in read_metrics(run, "episode") if e.get("status") in ("ok", "truncated", "timeout")]
    ran = [e for e in episodes if not e.get("eval_shared", False)]
    return {
        "s_per_step": round(statistics.median(b - a for a, b in zip(times[1:], times[2:], strict=False)), 2)
        if len(times) > 2 else None,
        "eval_ran_fraction": round(len(ran) / len(episodes), 3) if episodes else None,
        "eval_s_mean_when_run": round(statistics.fmean(e["timings"]["eval_s"] for e in ran), 3) if ran else None,
        "reward_mean": round(statistics.fmean(float(r["reward_mean"]) for _, r in steps), 3) if steps else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="where the two runs go (default: a temporary directory)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both arms")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps must be >= 3 (the first step's interval includes start-up and is not counted)")
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-eval-dedup-"))
    arms = {}
    for name, value in (("dedup", "true"), ("every_sample", "false")):
        figures = run_arm(name, out, args.steps, [f"run.seed={args.seed}", f"rollout.eval_dedup={value}", *args.overrides])
        arms[name] = {**figures, **dedup_figures(Path(figures["run"]))}
        print(json.dumps({"arm": name, **{k: arms[name][k] for k in (
            "s_per_step", "episodes_per_min", "eval_ran_fraction", "eval_s_mean_when_run", "reward_mean")}}), flush=True)
    on, off = arms["dedup"]["s_per_step"], arms["every_sample"]["s_per_step"]
    print(json.dumps({"bench": "eval_dedup", "steps": args.steps, "seed": args.seed,
                      "s_per_step_dedup": on, "s_per_step_every_sample": off,
                      "speedup": round(off / on, 2) if on and off else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
