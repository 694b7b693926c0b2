"""Idle and wait figures of a run: how much of the time the trainer and the inference servers had nothing to do.

Computed from the metrics a run already writes (``train_step`` and ``episode`` records) for ``spoolrl report``;
``scripts/bench_overlap.py`` computes its trainer idle with the same :func:`trainer_idle` (its inference idle
comes from its stand-in server's own request intervals, through :func:`busy_share`).

Guarantees:
- ``trainer_wait_ratio``: the trainer's own accounting, the last ``train_step``'s ``idle_fraction`` (seconds it
  waited for a batch over its wall time since it started): Polar's "wait ratio".
- ``trainer_idle``: 1 - (seconds inside train steps) / (window), over the window from the start of the first
  step to the end of the last one: the share of time the trainer's accelerators did no training (waiting for
  data, publishing, bookkeeping). A step's start is its record's ``t`` minus its ``step_s``.
- ``inference_idle``: the share of the same window in which no episode was in RUN, the only stage that sends
  requests to the inference servers. It is a lower bound on the servers' idle time (an episode in RUN is also
  running tools, when the servers may have nothing to do); RUN intervals come from each ``episode`` record's
  ``t`` and its ``timings`` (RUN ends ``eval_wait_s + eval_s`` before the record).
- Every figure is None when the records do not hold what it needs (no steps, a window of zero length).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

Interval = tuple[float, float]


def busy_share(intervals: Iterable[Interval], start: float, end: float) -> float:
    """Share of [start, end] covered by the union of ``intervals`` (overlaps counted once)."""
    if end <= start:
        raise ValueError(f"empty window [{start}, {end}]")
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    covered, reach = 0.0, start
    for a, b in clipped:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered / (end - start)


def step_intervals(steps: Iterable[dict[str, Any]]) -> list[Interval]:
    """[start, end] of every ``train_step`` record (end = its ``t``, start = end - ``step_s``)."""
    return [(float(r["t"]) - float(r["step_s"]), float(r["t"])) for r in steps]


def run_intervals(episodes: Iterable[dict[str, Any]]) -> list[Interval]:
    """[start, end] of the RUN stage of every ``episode`` record that went through RUN."""
    out = []
    for e in episodes:
        tm = e.get("timings") or {}
        if "run_s" not in tm:
            continue
        end = float(e["t"]) - float(tm.get("eval_wait_s", 0.0)) - float(tm.get("eval_s", 0.0))
        out.append((end - float(tm["run_s"]), end))
    return out


def trainer_idle(steps: list[dict[str, Any]], start: float, end: float) -> float:
    """1 - the share of [start, end] spent inside train steps."""
    return 1.0 - busy_share(step_intervals(steps), start, end)


def overlap_figures(records: Iterable[dict[str, Any]]) -> dict[str, float | None]:
    """``trainer_wait_ratio``, ``trainer_idle`` and ``inference_idle`` of a run's metrics records."""
    recs = list(records)
    steps = sorted((r for r in recs if r.get("kind") == "train_step" and "step_s" in r), key=lambda r: r["t"])
    episodes = [r for r in recs if r.get("kind") == "episode"]
    out: dict[str, float | None] = {"trainer_wait_ratio": None, "trainer_idle": None, "inference_idle": None}
    if not steps:
        return out
    if isinstance(steps[-1].get("idle_fraction"), (int, float)):
        out["trainer_wait_ratio"] = round(float(steps[-1]["idle_fraction"]), 4)
    start, end = step_intervals(steps[:1])[0][0], float(steps[-1]["t"])
    if end <= start:
        return out
    out["trainer_idle"] = round(trainer_idle(steps, start, end), 4)
    out["inference_idle"] = round(1.0 - busy_share(run_intervals(episodes), start, end), 4)
    return out
