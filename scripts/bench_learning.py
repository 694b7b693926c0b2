#!/usr/bin/env python3
"""Wall time to reward 0.8 on ``builtin-pick``: asynchronous against synchronous, same tasks, seed and machine.

Both arms are ``spoolrl demo`` runs (real engine, bwrap sandboxes, EVAL, spool, DeepSpeed, live reloads)
from the same warm-started model, one after the other, with the same steps and seed:
- async: rollouts never wait for the trainer; up to ``trainer.max_tasks_outstanding`` = 3 steps' tasks
  ahead (the demo itself issues one step's tasks at a time, so that every step holds one task of each
  value: the rollout node claims outstanding tasks in random order), samples up to ``algorithm.max_staleness`` versions old are trained (with the importance
  correction), the next batch is prepared while a step trains (``trainer.prefetch``).
- sync: every batch is sampled from the current policy: the feeder issues one step's tasks at a time
  (``trainer.max_tasks_outstanding = algorithm.groups_per_step``), no prefetch, staleness 0
  (``algorithm.max_staleness = 0``, the one limit both sides obey); rollouts therefore pause while the
  trainer steps.

"Reached 0.8" = the first step at which the mean reward of the last 3 steps is >= 0.8; time is counted from
the trainer's start (model load and warm start excluded, the same in both arms). Printed per arm: time and
steps to 0.8, final reward (mean of the last 5 steps), trainer idle fraction, episodes per minute; then the
ratio sync/async of the times to 0.8. One JSON line per arm and one summary line on stdout.

    .venv/bin/python scripts/bench_learning.py [--steps 40] [--seed 0] [--out DIR [--reuse]] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc.metrics import read_metrics  # noqa: E402

TARGET = 0.8
WINDOW = 3


def async_overrides(groups_per_step: int) -> list[str]:
    return [f"trainer.max_tasks_outstanding={3 * groups_per_step}", "trainer.prefetch=true"]


def sync_overrides(groups_per_step: int) -> list[str]:
    return [f"trainer.max_tasks_outstanding={groups_per_step}", "trainer.prefetch=false", "algorithm.max_staleness=0"]


def arm_overrides(seed: int, groups_per_step: int, extra: list[str]) -> dict[str, list[str]]:
    """Each arm's ``spoolrl demo`` overrides, in the order the arms run."""
    common = [f"run.seed={seed}", f"algorithm.groups_per_step={groups_per_step}", *extra]
    return {"async": [*common, *async_overrides(groups_per_step)], "sync": [*common, *sync_overrides(groups_per_step)]}


def check_arms(arms: dict[str, list[str]], steps: int) -> None:
    """Both arms' configs, validated as the demo will, before the first ~12-minute arm starts."""
    from hpc.cli.demo_run import DEMO_OVERRIDES
    from hpc.config import load_config
    from hpc.errors import ConfigError

    for name, overrides in arms.items():
        try:
            load_config(None, [*DEMO_OVERRIDES, f"trainer.total_steps={steps}", *overrides])
        except ConfigError as exc:
            raise SystemExit(f"bench_learning: the {name} arm's config is invalid: {exc}") from exc


def arm_figures(run: Path) -> dict[str, Any]:
    steps = sorted({int(r["step"]): r for r in read_metrics(run, "train_step")}.items())
    starts = [r["t"] for r in read_metrics(run, "trainer_start")]
    t0 = min(starts) if starts else (steps[0][1]["t"] if steps else 0.0)
    rewards = [float(r["reward_mean"]) for _, r in steps]
    reached = next((i for i in range(WINDOW - 1, len(rewards))
                    if sum(rewards[i - WINDOW + 1: i + 1]) / WINDOW >= TARGET), None)
    episodes = list(read_metrics(run, "episode"))
    span_min = (max(e["t"] for e in episodes) - min(e["t"] for e in episodes)) / 60 if len(episodes) > 1 else 0.0
    last = steps[-1][1] if steps else {}
    return {
        "steps": len(steps),
        "steps_to_target": None if reached is None else steps[reached][0],
        "time_to_target_s": None if reached is None else round(steps[reached][1]["t"] - t0, 1),
        "final_reward": round(sum(rewards[-5:]) / len(rewards[-5:]), 3) if rewards else None,
        "first_reward": round(sum(rewards[:3]) / len(rewards[:3]), 3) if rewards else None,
        "trainer_idle_fraction": last.get("idle_fraction"),
        "episodes": len(episodes),
        "episodes_per_min": round(len(episodes) / span_min, 1) if span_min else None,
        "wall_s": round(steps[-1][1]["t"] - t0, 1) if steps else None,
    }


def run_arm(name: str, out: Path, steps: int, overrides: list[str], reuse: bool = False) -> dict[str, Any]:
    run = out / name
    if reuse and (run / "run.yaml").is_file() and arm_figures(run)["steps"] >= steps:
        figures = {"arm": name, "run": str(run), "reused": True, **arm_figures(run)}
        print(json.dumps(figures), flush=True)
        return figures
    cmd = [sys.executable, "-m", "hpc.cli", "demo", "--out", str(run), "--steps", str(steps), *overrides]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{name}: demo failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    figures = {"arm": name, "run": str(run), "demo_wall_s": round(time.monotonic() - t0, 1), **arm_figures(run)}
    print(json.dumps(figures), flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="trainer steps per arm (default 40, the demo's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups-per-step", type=int, default=4, help="groups per trainer step (default 4, the demo's)")
    parser.add_argument("--out", type=Path, help="where the two runs go (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true",
                        help="an arm whose directory under --out already holds a finished run of --steps steps is "
                        "read, not run again (to finish a bench that stopped in its second arm)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for both arms")
    args = parser.parse_args(argv)
    if args.reuse and not args.out:
        parser.error("--reuse reads earlier arms from --out DIR: give --out")
    overrides = arm_overrides(args.seed, args.groups_per_step, args.overrides)
    check_arms(overrides, args.steps)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    a, s = (run_arm(name, out, args.steps, arm, args.reuse) for name, arm in overrides.items())
    ratio = (s["time_to_target_s"] / a["time_to_target_s"]
             if a["time_to_target_s"] and s["time_to_target_s"] else None)
    print(json.dumps({"bench": "learning", "target": TARGET, "async_time_s": a["time_to_target_s"],
                      "sync_time_s": s["time_to_target_s"], "sync_over_async": None if ratio is None else round(ratio, 2),
                      "async_episodes_per_min": a["episodes_per_min"], "sync_episodes_per_min": s["episodes_per_min"],
                      "async_idle": a["trainer_idle_fraction"], "sync_idle": s["trainer_idle_fraction"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
