"""What happened in a run, from its metrics records and ``run.yaml``: the one summary the demo, ``status`` and the
report print (so the three agree).

Guarantees:
- Pure over the records (plus ``run.yaml`` for the step target); a missing piece is ``None``, never an exception.
- The reward of a step (:func:`step_rewards`) is the mean over every finished episode (an ``episode`` record with
  a numeric reward, any status) of the step's tasks (the trainer's ``train_step.task_ids``); the trained batch's
  reward (``train_step.reward_mean``: the samples left after the consumer's filters) is kept beside it as
  ``trained_batch_reward``. A step without ``task_ids`` (older runs) has ``reward`` ``None``.
- The first-vs-last figure (:func:`reward_summary`) averages the first :data:`FIRST_STEPS` and the last
  :data:`LAST_STEPS` steps; it uses the episode reward when every step has one, else the trained batch's,
  and says which in ``reward_of``.
- ``finished``: the last trainer step reached ``trainer.total_steps``; ``start``/``end`` are the first and the
  last record's time (unix seconds), ``duration_s`` their difference.
- ``nonfinite_steps``: the last ``train_step``'s ``nonfinite_steps`` field, when the trainer writes one.
- ``harness`` (:func:`harness_summary`, ``rollout.policy: harness``): over the ``episode`` records that carry
  ``segments_per_episode`` (the rollout node writes it for every finished harness episode): how many, segments per
  episode (mean, max, episodes of more than one) and the tokens prefilled again (``reprefill_tokens``: total and per
  episode); ``None`` when the run has no such episode.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from hpc.paths import RunPaths

FIRST_STEPS, LAST_STEPS = 3, 5
EPISODE_REWARD = "every finished episode of the step's tasks"
BATCH_REWARD = "the trained batch (after filters)"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def step_rewards(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trainer step, in step order (the last record of a step wins): ``step``, ``reward``, ``episodes``
    (how many finished episodes it averages) and ``trained_batch_reward``."""
    steps: dict[int, dict[str, Any]] = {}
    by_task: dict[str, list[float]] = defaultdict(list)
    for rec in records:
        if rec.get("kind") == "train_step" and isinstance(rec.get("step"), int):
            steps[rec["step"]] = rec
        elif rec.get("kind") == "episode" and (reward := _number(rec.get("reward"))) is not None:
            by_task[str(rec.get("task_id"))].append(reward)
    out = []
    for step, rec in sorted(steps.items()):
        task_ids = rec.get("task_ids")
        rewards = [r for t in task_ids for r in by_task.get(str(t), [])] if isinstance(task_ids, list) else []
        out.append({"step": step, "reward": sum(rewards) / len(rewards) if rewards else None,
                    "episodes": len(rewards), "trained_batch_reward": _number(rec.get("reward_mean"))})
    return out


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 3)


def reward_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """First-vs-last reward of :func:`step_rewards` rows (see the module docstring)."""
    batch = [r["trained_batch_reward"] for r in rows if r["trained_batch_reward"] is not None]
    episodes = [r["reward"] for r in rows if r["reward"] is not None]
    use_episodes = bool(rows) and len(episodes) == len(rows)
    values = episodes if use_episodes else batch
    if not values:
        return {"reward_first": None, "reward_last": None, "reward_of": None}
    out: dict[str, Any] = {
        "reward_first": _mean(values[:FIRST_STEPS]), "reward_last": _mean(values[-LAST_STEPS:]),
        "reward_first_steps": len(values[:FIRST_STEPS]), "reward_last_steps": len(values[-LAST_STEPS:]),
        "reward_of": EPISODE_REWARD if use_episodes else BATCH_REWARD}
    if use_episodes and batch:
        out.update(trained_batch_reward_first=_mean(batch[:FIRST_STEPS]),
                   trained_batch_reward_last=_mean(batch[-LAST_STEPS:]))
    return out


def harness_summary(records: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Segments and tokens prefilled again over the harness episodes (module docstring); None without any."""
    counts, refilled = [], []
    for rec in records:
        if rec.get("kind") == "episode" and (n := _number(rec.get("segments_per_episode"))) is not None:
            counts.append(int(n))
            refilled.append(int(_number(rec.get("reprefill_tokens")) or 0))
    if not counts:
        return None
    return {"episodes": len(counts), "segments_per_episode_mean": round(_mean([float(c) for c in counts]), 3),
            "segments_per_episode_max": max(counts), "split_episodes": sum(c > 1 for c in counts),
            "reprefill_tokens": sum(refilled), "reprefill_tokens_per_episode": round(sum(refilled) / len(counts), 1)}


def total_steps(paths: RunPaths) -> int | None:
    """``trainer.total_steps`` of the run's ``run.yaml`` (``config:`` then the sections; None if unreadable)."""
    try:
        doc = yaml.safe_load(paths.run_yaml.read_text())
        value = doc["config"]["trainer"]["total_steps"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return value if isinstance(value, int) else None


def run_summary(run_dir: str | Path, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of the module docstring: progress, time span and rewards."""
    paths = RunPaths(Path(run_dir))
    rows = step_rewards(records)
    times = [t for r in records if (t := _number(r.get("t"))) is not None]
    step = rows[-1]["step"] if rows else 0
    target = total_steps(paths)
    steps = [r for r in records if r.get("kind") == "train_step"]
    nonfinite = steps[-1].get("nonfinite_steps") if steps else None
    start, end = (min(times), max(times)) if times else (None, None)
    return {"finished": target is not None and step >= target, "step": step, "total_steps": target,
            "start": start, "end": end, "duration_s": round(end - start, 1) if start is not None and end else None,
            **reward_summary(rows), "nonfinite_steps": nonfinite, "harness": harness_summary(records)}


def clock(t: float | None) -> str:
    """A record time as local ``YYYY-mm-dd HH:MM:SS`` (``-`` for None)."""
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def duration(seconds: float | None) -> str:
    """``1 h 02 m 03 s`` / ``4 m 05 s`` / ``6 s``."""
    if seconds is None:
        return "-"
    s = round(seconds)
    h, m, sec = s // 3600, s // 60 % 60, s % 60
    return f"{h} h {m:02d} m {sec:02d} s" if h else f"{m} m {sec:02d} s" if m else f"{sec} s"


def _steps(n: int) -> str:
    return f"{n} step{'' if n == 1 else 's'}"


def summary_lines(s: dict[str, Any]) -> list[str]:
    """The human-readable summary (no dict reprs): progress, time span, reward first -> last."""
    target = s["total_steps"] if s["total_steps"] is not None else "?"
    state = "finished" if s["finished"] else "not finished"
    lines = [f"{state}: step {s['step']}/{target}; started {clock(s['start'])}, last record {clock(s['end'])} "
             f"({duration(s['duration_s'])})"]
    if s["reward_first"] is not None:
        line = (f"reward {s['reward_first']:.2f} (mean of the first {_steps(s['reward_first_steps'])}) -> "
                f"{s['reward_last']:.2f} (last {_steps(s['reward_last_steps'])}), over {s['reward_of']}")
        if s.get("trained_batch_reward_first") is not None:
            line += (f"; trained batch reward (after filters) {s['trained_batch_reward_first']:.2f} -> "
                     f"{s['trained_batch_reward_last']:.2f}")
        lines.append(line)
    if s.get("nonfinite_steps") is not None:
        lines.append(f"non-finite steps (skipped, nothing applied): {s['nonfinite_steps']}")
    if h := s.get("harness"):
        lines.append(harness_line(h))
    return lines


def harness_line(h: dict[str, Any]) -> str:
    """:func:`harness_summary` as one sentence (``status``, the demo and the report's page)."""
    return (f"harness episodes {h['episodes']}: {h['segments_per_episode_mean']:.2f} segments per episode (max "
            f"{h['segments_per_episode_max']}; {h['split_episodes']} split into several), tokens prefilled again "
            f"{h['reprefill_tokens']} ({h['reprefill_tokens_per_episode']:.1f} per episode)")
