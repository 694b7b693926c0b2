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

``--staleness`` runs the forced-staleness arms instead (issue 34): the synchronous regime above (one step's
tasks outstanding, no prefetch) with every batch exactly k = 0, 1, 2, 4 versions old (``--lags``), with and
without the importance weight (k = 0 only with it: on-policy the weight is 1), ``--seeds`` each. Each arm is a
``scripts/stale_demo.py`` run: the inference servers load ``LATEST - k``, so a step trained at version v samples
version v - k, and ``algorithm.max_staleness`` = k drops nothing (``stale_demo.py`` says how it is injected; the
library has no knob for it). Equal sample counts: policy version n was trained on n batches in every arm, and its
reward is that of the batch drawn from it (the step ``n + k + 1``), so an arm of lag k runs ``--steps`` + k steps
and every arm measures versions 0 .. ``--steps`` - 1. Printed per arm: the reward of its first and last
:data:`VERSIONS_COMPARED` versions (half of them below 6), the staleness histogram, ``ratio_dev`` (mean |pi/mu - 1| per token),
the share truncated at ``tis_cap`` and the mean weight over its stale steps; then a table over seeds and one JSON
summary line.

    .venv/bin/python scripts/bench_learning.py [--steps 40] [--seed 0] [--out DIR [--reuse]] [key=value ...]
    .venv/bin/python scripts/bench_learning.py --staleness [--steps 40] [--seeds 0,1] [--lags 0,1,2,4] [--out DIR]
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc.metrics import read_metrics  # noqa: E402

TARGET = 0.8
WINDOW = 3
CPU_EVERY_S = 0.5
VERSIONS_COMPARED = 3  # the staleness arms compare each arm's first and last 3 policy versions (fewer: half)
DEMO = (sys.executable, "-m", "hpc.cli", "demo")


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


@dataclass(frozen=True)
class StaleArm:
    """One forced-staleness arm: every batch ``lag`` versions old, with or without the importance weight."""

    lag: int
    is_weight: bool
    seed: int

    @property
    def name(self) -> str:
        return f"lag{self.lag}-{'is' if self.is_weight else 'nois'}-seed{self.seed}"

    def overrides(self, groups_per_step: int, extra: list[str]) -> list[str]:
        """The synchronous regime, staleness limit ``lag`` (nothing dropped) and ``lag`` + 1 versions kept."""
        return [f"run.seed={self.seed}", f"algorithm.groups_per_step={groups_per_step}", *extra,
                f"trainer.max_tasks_outstanding={groups_per_step}", "trainer.prefetch=false",
                f"algorithm.max_staleness={self.lag}", f"trainer.keep_policies={max(3, self.lag + 2)}"]

    def launcher(self) -> tuple[str, ...]:
        return (sys.executable, str(ROOT / "scripts" / "stale_demo.py"), "--lag", str(self.lag),
                *(() if self.is_weight else ("--no-is-weight",)), "--")


def stale_arms(seeds: list[int], lags: list[int]) -> list[StaleArm]:
    """Every lag with and without the weight (lag 0 only with it), each over every seed, in the order they run
    (an arm's seeds one after the other: a bench stopped early has whole arms)."""
    return [StaleArm(lag, is_weight, seed) for lag in lags for is_weight in (True, False) for seed in seeds
            if lag or is_weight]


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


def run_arm(name: str, out: Path, steps: int, overrides: list[str], reuse: bool = False,
            launcher: tuple[str, ...] = DEMO) -> dict[str, Any]:
    """One arm's demo run (``launcher`` + its arguments: ``spoolrl demo``, or :mod:`stale_demo`); its figures."""
    run = out / name
    if reuse and (run / "run.yaml").is_file() and arm_figures(run)["steps"] >= steps:
        figures = {"arm": name, "run": str(run), "reused": True, **arm_figures(run)}
        print(json.dumps(figures), flush=True)
        return figures
    cmd = [*launcher, "--out", str(run), "--steps", str(steps), *overrides]
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


def _mean(values: list[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def version_rewards(steps: list[dict[str, Any]]) -> tuple[dict[int, float], int]:
    """Each policy version's reward, that of the batches drawn from it: step s trains at version s - 1
    (``trainer.publish_every`` 1, the demo's) on samples ``staleness`` old (with a lag k the initial model draws
    the first k + 1 batches: their mean). Also how many steps mixed sample ages (none when the lag is forced; such
    a step names no one version)."""
    drawn: dict[int, list[float]] = {}
    mixed = 0
    for r in steps:
        ages = [int(a) for a in (r.get("staleness_hist") or {})]
        if len(ages) != 1:
            mixed += 1
            continue
        drawn.setdefault(int(r["step"]) - 1 - ages[0], []).append(float(r["reward_mean"]))
    return {v: sum(xs) / len(xs) for v, xs in drawn.items()}, mixed


def compared(horizon: int) -> int:
    """How many first and last versions are compared: :data:`VERSIONS_COMPARED`, at most half the horizon."""
    return min(VERSIONS_COMPARED, max(1, horizon // 2))


def stale_figures(run: Path, arm: StaleArm, horizon: int) -> dict[str, Any]:
    """The arm's reward per policy version 0 .. horizon - 1 and the off-policy statistics of its steps at the
    full lag (step > lag: earlier steps sample the initial model, fewer versions behind)."""
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: int(r["step"]))
    rewards, mixed = version_rewards(steps)
    measured = [rewards.get(v) for v in range(horizon)]
    known = [x for x in measured if x is not None]
    hist: dict[str, int] = {}
    for r in steps:
        for age, n in (r.get("staleness_hist") or {}).items():
            hist[str(age)] = hist.get(str(age), 0) + int(n)
    full = [r for r in steps if int(r["step"]) > arm.lag]
    return {"lag": arm.lag, "is_weight": arm.is_weight, "seed": arm.seed, "versions_measured": len(known),
            "reward_by_version": [None if x is None else round(x, 3) for x in measured],
            "reward_first": _mean(known[:compared(horizon)]), "reward_last": _mean(known[-compared(horizon):]),
            "staleness_hist": hist, "mixed_steps": mixed,
            **{key: _mean([float(r[key]) for r in full]) for key in ("ratio_dev", "truncated_fraction", "weight_mean")}}


def stale_table(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (lag, weight): the reward of the first and last versions, per seed and their mean, and the mean
    off-policy statistics."""
    cells: dict[tuple[int, bool], list[dict[str, Any]]] = {}
    for r in rows:
        cells.setdefault((r["lag"], r["is_weight"]), []).append(r)
    table = []
    for (lag, is_weight), rs in sorted(cells.items(), key=lambda c: (c[0][0], not c[0][1])):
        last = [r["reward_last"] for r in rs if r["reward_last"] is not None]
        table.append({"lag": lag, "is_weight": is_weight, "seeds": [r["seed"] for r in rs],
                      "reward_last_by_seed": last, "reward_last": _mean(last),
                      "reward_first": _mean([r["reward_first"] for r in rs if r["reward_first"] is not None]),
                      **{key: _mean([r[key] for r in rs if r[key] is not None])
                         for key in ("ratio_dev", "truncated_fraction", "weight_mean")}})
    return table


def run_staleness(args: argparse.Namespace, out: Path) -> int:
    """The forced-staleness arms (module docstring), then the table and one JSON summary line."""
    arms = stale_arms(args.seeds, args.lags)
    check_arms({a.name: a.overrides(args.groups_per_step, args.overrides) for a in arms}, args.steps + max(args.lags))
    rows = []
    for arm in arms:
        run_arm(arm.name, out, args.steps + arm.lag, arm.overrides(args.groups_per_step, args.overrides),
                args.reuse, arm.launcher())
        rows.append({"arm": arm.name, **stale_figures(out / arm.name, arm, args.steps)})
        print(json.dumps(rows[-1]), flush=True)
    table = stale_table(rows)
    n = compared(args.steps)
    print(f"reward of policy versions 0..{n - 1} -> {args.steps - n}..{args.steps - 1} (each trained on as many "
          f"samples in every arm), seeds {args.seeds}:", file=sys.stderr)
    for c in table:
        print(f"  lag {c['lag']} {'IS    ' if c['is_weight'] else 'no IS '} reward {c['reward_first']} -> "
              f"{c['reward_last']} {c['reward_last_by_seed']}  ratio_dev {c['ratio_dev']}  truncated "
              f"{c['truncated_fraction']}  weight {c['weight_mean']}", file=sys.stderr)
    print(json.dumps({"bench": "learning_staleness", "versions": args.steps, "compared": n,
                      "groups_per_step": args.groups_per_step, "table": table}))
    return 0


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40, help="trainer steps per arm (default 40, the demo's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups-per-step", type=int, default=4, help="groups per trainer step (default 4, the demo's)")
    parser.add_argument("--out", type=Path, help="where the two runs go (default: a temporary directory)")
    parser.add_argument("--reuse", action="store_true",
                        help="an arm whose directory under --out already holds a finished run of --steps steps is "
                        "read, not run again (to finish a bench that stopped in its second arm)")
    parser.add_argument("--staleness", action="store_true",
                        help="run the forced-staleness arms instead of async vs sync (--steps: policy versions "
                        "compared; an arm of lag k runs --steps + k steps)")
    parser.add_argument("--seeds", type=_ints, default=[0, 1], help="--staleness: seeds, comma-separated (0,1)")
    parser.add_argument("--lags", type=_ints, default=[0, 1, 2, 4], help="--staleness: lags, comma-separated")
    parser.add_argument("overrides", nargs="*", help="extra config overrides for every arm")
    args = parser.parse_args(argv)
    if args.reuse and not args.out:
        parser.error("--reuse reads earlier arms from --out DIR: give --out")
    if args.staleness:
        if min(args.lags, default=-1) < 0 or args.steps < 2:
            parser.error("--staleness needs lags >= 0 and --steps >= 2")
        return run_staleness(args, args.out or Path(tempfile.mkdtemp(prefix="bench-staleness-")))
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
