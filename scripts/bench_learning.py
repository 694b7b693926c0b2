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

Each arm also samples the host's CPU (``/proc/stat``, every 0.5 s, kept in ``<out>/<arm>.cpu.jsonl``) and
prints ``host_cpu_busy``, the share of every core's time spent busy (user, system, irq) between the trainer's
start and its last step. Overlap can only speed a run up by filling idle cores: at the same CPU work per step, an
arm that keeps the host busy a fraction b of the time can run at most 1/b faster (``overlap_bound``), whatever
runs beside what.

    .venv/bin/python scripts/bench_learning.py [--steps 40] [--seed 0] [--out DIR [--reuse]] [key=value ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc.metrics import read_metrics  # noqa: E402

TARGET = 0.8
WINDOW = 3
CPU_EVERY_S = 0.5


def cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from ``/proc/stat``'s ``cpu`` line (idle and iowait are
    not busy; steal is not counted at all)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq = fields[:7]
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait


@contextmanager
def sample_cpu(path: Path) -> Iterator[None]:
    """Append ``{"t", "busy", "total"}`` to ``path`` every :data:`CPU_EVERY_S` until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        with path.open("a") as f:
            while True:
                busy, total = cpu_jiffies()
                f.write(json.dumps({"t": time.time(), "busy": busy, "total": total}) + "\n")
                f.flush()
                if stop.wait(CPU_EVERY_S):
                    return

    thread = threading.Thread(target=loop, name="bench-cpu", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def cpu_log_of(run: Path) -> Path:
    """Where an arm's CPU samples go: beside its run directory (``spoolrl demo`` wants that one empty)."""
    return run.with_name(run.name + ".cpu.jsonl")


def host_cpu_busy(samples: list[dict[str, float]], start: float, end: float) -> float | None:
    """The busy share of the host's cores between the samples nearest ``start`` and ``end`` (None without two)."""
    inside = [s for s in samples if start - CPU_EVERY_S <= s["t"] <= end + CPU_EVERY_S]
    if len(inside) < 2 or inside[-1]["total"] <= inside[0]["total"]:
        return None
    return (inside[-1]["busy"] - inside[0]["busy"]) / (inside[-1]["total"] - inside[0]["total"])


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
    cpu_log = cpu_log_of(run)
    samples = [json.loads(x) for x in cpu_log.read_text().splitlines() if x.strip()] if cpu_log.is_file() else []
    busy = host_cpu_busy(samples, t0, steps[-1][1]["t"]) if steps else None
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
        "host_cpu_busy": None if busy is None else round(busy, 3),
        "overlap_bound": round(1 / busy, 2) if busy else None,
    }


def run_arm(name: str, out: Path, steps: int, overrides: list[str], reuse: bool = False) -> dict[str, Any]:
    run = out / name
    if reuse and (run / "run.yaml").is_file() and arm_figures(run)["steps"] >= steps:
        figures = {"arm": name, "run": str(run), "reused": True, **arm_figures(run)}
        print(json.dumps(figures), flush=True)
        return figures
    cmd = [sys.executable, "-m", "hpc.cli", "demo", "--out", str(run), "--steps", str(steps), *overrides]
    t0 = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    cpu_log_of(run).unlink(missing_ok=True)
    with sample_cpu(cpu_log_of(run)):
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
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
                      "async_idle": a["trainer_idle_fraction"], "sync_idle": s["trainer_idle_fraction"],
                      "async_host_cpu_busy": a["host_cpu_busy"], "sync_host_cpu_busy": s["host_cpu_busy"],
                      "sync_overlap_bound": s["overlap_bound"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
