#!/usr/bin/env python3
"""A discrete-event model of spoolrl's scheduling (issue 35): rollout nodes with INIT/RUN/EVAL worker pools,
the feeder's ``max_tasks_outstanding``, groups, the consumer's staleness filter and a trainer that steps when a
batch is ready, fed by the distributions ``scripts/bench_overlap.py`` measured.

What is modelled, as the real parts do it:
- The feeder keeps ``(max_staleness + 1) x groups_per_step`` tasks outstanding (``groups_per_step`` when
  synchronous, staleness 0), each of ``group_size`` samples; a task is resolved when its group is trained or
  dropped, and a new one is issued at once.
- Each sample goes INIT -> RUN -> EVAL through its node's worker pools (FIFO queues; tasks go to the node with the
  fewest samples in flight); stage times are drawn from the measured samples (the tail included), scaled so their
  mean is the shape's mean. RUN also takes one of ``llm_slots`` (the inference fleet's concurrent sequences at the
  calibrated latency).
- A sample's policy version is the one published when its RUN starts. A complete group joins its node's open
  shard, which is sealed when full (``shard_max_trajectories``), when the node has nothing left in flight, when
  the node sees the trainer waiting (``control/TRAINER_WAITING``: the trainer raises it when it finds no batch
  and removes it when it takes one; each node sees a change at its next control poll, every
  ``max(0.2, spool.poll_interval_s)`` s, then seals its open shard and, while the marker stands, every group as
  it is written; ``trainer_signal``), or by the writer's age thread once ``spool.shard_max_age_s`` old (checked
  every ``min(1, age / 4)`` s); the trainer's batch source finds it at its next poll (every
  ``min(0.2, spool.poll_interval_s)`` s). The trainer
  takes ``groups_per_step`` groups in arrival order, drops a group whose staleness at the training version
  exceeds ``max_staleness`` (waste), and steps for a time drawn from the measured step times; each step
  publishes a version, then the loop's own work between steps (marking trained, publish, metrics, the
  feeder's top-up: the bench's measured ``loop_s``) runs before the feeder tops up and the next batch is taken.
- Validation replays each bench cell's own measurements in the order they happened (the load on a shared
  machine drifts within a cell, and the cell's figures are over its later steps); the shapes a user plans
  draw at random from every cell's pooled.

Not modelled: coordination cost in the spool (``scripts/bench_pipeline.py`` part 2 measures it flat per task up
to 16 processes), retries and faults, the rollout node's own stale cancellation (the consumer's drop stands in
for it), the bound on the node's stage queues (``rollout.queue_size``), and inference slowing as its batch grows
(the calibrated latency is one batch size's).

Figures per cell are the bench's: samples/hour over the steps after ``warm_steps``, trainer idle, inference
idle (no episode in RUN), waste, fraction of min(rollout capacity, trainer capacity).

    PYTHONPATH=$PWD .venv/bin/python scripts/sim_overlap.py --bench BENCH.json   # validate, then user shapes
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import random
import statistics
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpc.overlap import busy_share  # noqa: E402

STAGES = ("init", "run", "eval")
NODE_TICK_S = 0.2  # the rollout node's control loop (rollout_node.pipeline.state.TICK_S)


@dataclass(frozen=True)
class Dists:
    """Measured samples (seconds) of each stage, of a trainer step and of the trainer loop's own time between
    steps (``loop``: marking trained, publish, metrics, the feeder's top-up). ``replay``: hand them out in the
    order they were measured (one bench cell's own, so the load's drift over the cell is replayed) instead of
    at random; either way scaled so their mean is the shape's."""

    stage: dict[str, list[float]]
    step: list[float]
    loop: list[float] = field(default_factory=lambda: [0.0])
    replay: bool = False


class Draws:
    """One simulation's source of durations from :class:`Dists`."""

    def __init__(self, dists: Dists, rng: random.Random) -> None:
        self.d, self.rng = dists, rng
        self.taken: dict[str, int] = {}

    def _take(self, name: str, xs: list[float]) -> float:
        if not self.d.replay:
            return self.rng.choice(xs)
        k = self.taken.get(name, 0)
        self.taken[name] = k + 1
        return xs[k % len(xs)]

    def stage(self, stage: str, mean: float) -> float:
        xs = self.d.stage[stage]
        return self._take(stage, xs) * mean / statistics.fmean(xs)

    def step(self, mean: float) -> float:
        return self._take("step", self.d.step) * mean / statistics.fmean(self.d.step)

    def loop(self) -> float:
        return self._take("loop", self.d.loop)


@dataclass(frozen=True)
class SimShape:
    nodes: int = 1
    init_workers: int = 4  # per node
    run_workers: int = 8
    eval_workers: int = 3
    llm_slots: int = 8  # in all
    group_size: int = 2
    groups_per_step: int = 4
    means: dict[str, float] = field(default_factory=lambda: {"init": 0.1, "run": 3.4, "eval": 0.7})
    step_s: float = 3.2
    shard_max_age_s: float = 0.2  # spool.shard_max_age_s (the default is 30)
    shard_max_trajectories: int = 128  # spool.shard_max_trajectories
    poll_interval_s: float = 0.05  # spool.poll_interval_s (the default is 1; the trainer polls at most every 0.2 s)
    eval_dedup: bool = False  # a group's samples share one diff: one test run, the siblings wait for it
    eval_occupied_s: float | None = None  # with eval_dedup: a sample's mean time in EVAL (its wait included)
    trainer_signal: bool = True  # control/TRAINER_WAITING: nodes seal at once while the trainer waits
    steps: int = 9
    warm_steps: int = 2

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.groups_per_step

    def rollout_capacity(self) -> float:
        """Samples/s of the slowest stage (or the LLM slots over the RUN time), from each sample's mean time in the
        stage (as the bench measures capacity: with ``eval_dedup``, ``eval_occupied_s``)."""
        occupied = dict(self.means, **({"eval": self.eval_occupied_s} if self.eval_occupied_s is not None else {}))
        caps = [self.nodes * getattr(self, f"{s}_workers") / occupied[s] for s in STAGES]
        return min(*caps, self.llm_slots / self.means["run"])

    def rollout_step_s(self) -> float:
        return self.samples_per_step / self.rollout_capacity()


@dataclass
class _Group:
    task: int
    left: int
    version: int = 1 << 30  # oldest version among its samples
    done_at: float = 0.0
    eval_end: float | None = None  # when the group's one test run ends (eval_dedup)


class Sim:
    """One run of the model; :meth:`run` returns the cell's figures."""

    def __init__(self, shape: SimShape, dists: Dists, max_staleness: int, seed: int) -> None:
        self.s, self.S = shape, max_staleness
        self.draws = Draws(dists, random.Random(seed))
        self.rng = random.Random(seed + 1_000_003)  # the spool's timing jitter, apart from the durations
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = 0
        self.queues = [{st: deque[_Group]() for st in STAGES} for _ in range(shape.nodes)]
        self.free = [{st: getattr(shape, f"{st}_workers") for st in STAGES} for _ in range(shape.nodes)]
        self.in_flight = [0] * shape.nodes
        self.shards: list[list[_Group]] = [[] for _ in range(shape.nodes)]  # each node's open shard
        self.shard_no = [0] * shape.nodes
        self.llm_free = shape.llm_slots
        self.llm_wait: deque[tuple[int, _Group]] = deque()
        self.version = 0
        self.next_task = 0
        self.outstanding = 0
        self.ready: deque[_Group] = deque()
        self.training = False
        self.waiting = False  # control/TRAINER_WAITING stands
        self.sees_wait = [False] * shape.nodes  # as each node last saw it
        self.wait_epoch = 0
        self.step_log: list[tuple[float, float, int]] = []  # (start, end, samples)
        self.run_spans: list[tuple[float, float]] = []
        self.generated = 0
        self.wasted = 0

    # -------------------------------------------------------------- event plumbing
    def at(self, t: float, fn: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn))

    def run(self) -> dict[str, Any]:
        self.top_up()
        while self.events and len(self.step_log) < self.s.steps:
            self.now, _, fn = heapq.heappop(self.events)
            fn()
        return self.figures()

    # -------------------------------------------------------------- feeder and rollout nodes
    def top_up(self) -> None:
        limit = self.s.groups_per_step * (self.S + 1)
        while self.outstanding < limit:
            self.outstanding += 1
            group = _Group(self.next_task, self.s.group_size)
            self.next_task += 1
            node = min(range(self.s.nodes), key=lambda n: self.in_flight[n])
            self.in_flight[node] += self.s.group_size
            for _ in range(self.s.group_size):
                self.queues[node]["init"].append(group)
            self.pump(node)

    def pump(self, node: int) -> None:
        for st in STAGES:
            q, free = self.queues[node][st], self.free[node]
            while q and free[st] > 0:
                if st == "run" and self.llm_free == 0:
                    break
                free[st] -= 1
                self.start(node, st, q.popleft())

    def start(self, node: int, stage: str, group: _Group) -> None:
        if stage == "eval" and self.s.eval_dedup and group.eval_end is not None:
            dt = max(0.0, group.eval_end - self.now)  # the sibling's run of the same diff: wait for its result
        else:
            dt = self.draws.stage(stage, self.s.means[stage])
            if stage == "eval":
                group.eval_end = self.now + dt
        if stage == "run":
            self.llm_free -= 1
            group.version = min(group.version, self.version)
            self.run_spans.append((self.now, self.now + dt))
        self.at(self.now + dt, lambda: self.finish(node, stage, group))

    def finish(self, node: int, stage: str, group: _Group) -> None:
        self.free[node][stage] += 1
        if stage == "run":
            self.llm_free += 1
        if stage == "eval":
            self.generated += 1
            self.in_flight[node] -= 1
            group.left -= 1
            if group.left == 0:
                self.write(node, group)
        else:
            self.queues[node][STAGES[STAGES.index(stage) + 1]].append(group)
        self.pump(node)
        if stage == "run" and self.llm_free == 1:  # the freed LLM slot may unblock another node's RUN queue
            for n in range(self.s.nodes):
                if self.queues[n]["run"] and self.free[n]["run"]:
                    self.pump(n)
                    break

    # -------------------------------------------------------------- the spool between them
    def write(self, node: int, group: _Group) -> None:
        """The node's shard writer: a complete group joins the open shard (opening one starts its age clock);
        the shard is sealed when full, when the node has nothing left in flight, or by the age thread (which
        looks every ``min(1, max_age / 4)`` s) once it is ``shard_max_age_s`` old."""
        shard = self.shards[node]
        if not shard:
            number = self.shard_no[node]
            tick = min(1.0, self.s.shard_max_age_s / 4)
            self.at(self.now + self.s.shard_max_age_s + self.rng.uniform(0, tick), lambda: self.seal(node, number))
        shard.append(group)
        full = len(shard) * self.s.group_size >= self.s.shard_max_trajectories
        if full or self.in_flight[node] == 0 or self.sees_wait[node]:
            self.seal(node, self.shard_no[node])

    def seal(self, node: int, number: int) -> None:
        """Publish the node's open shard (if it is still shard ``number``); the trainer's batch source finds it
        at its next poll."""
        if number != self.shard_no[node] or not self.shards[node]:
            return
        groups, self.shards[node] = self.shards[node], []
        self.shard_no[node] += 1
        poll = min(0.2, self.s.poll_interval_s)
        for group in groups:
            self.at(self.now + self.rng.uniform(0, poll), functools.partial(self.arrive, group))

    # -------------------------------------------------------------- consumer and trainer
    def arrive(self, group: _Group) -> None:
        self.ready.append(group)
        self.try_step()

    def try_step(self) -> None:
        if self.training:
            return
        kept: list[_Group] = []
        while self.ready and len(kept) < self.s.groups_per_step:
            g = self.ready.popleft()
            if self.version - g.version > self.S:
                self.wasted += self.s.group_size
                self.outstanding -= 1
            else:
                kept.append(g)
        if len(kept) < self.s.groups_per_step:
            self.ready.extendleft(reversed(kept))
            self.top_up()
            self.signal_wait(True)
            return
        self.signal_wait(False)
        self.training = True
        dt = self.draws.step(self.s.step_s)
        start = self.now
        self.at(self.now + dt, lambda: self.step_done(start, len(kept)))

    def signal_wait(self, on: bool) -> None:
        """The trainer raises (``on``) or removes ``control/TRAINER_WAITING``; each node sees the change at its next
        control poll (:meth:`node_sees`)."""
        if not self.s.trainer_signal or on == self.waiting:
            return
        self.waiting = on
        self.wait_epoch += 1
        epoch, poll = self.wait_epoch, max(NODE_TICK_S, self.s.poll_interval_s)
        for node in range(self.s.nodes):
            self.at(self.now + self.rng.uniform(0, poll), functools.partial(self.node_sees, node, on, epoch))

    def node_sees(self, node: int, on: bool, epoch: int) -> None:
        """A node's control poll reads the marker: it seals its open shard when the trainer waits."""
        if epoch != self.wait_epoch:
            return  # changed again before this node looked
        self.sees_wait[node] = on
        if on:
            self.seal(node, self.shard_no[node])

    def step_done(self, start: float, groups: int) -> None:
        """The step's tasks are resolved and its version published; the loop's own work (``Dists.loop``) runs
        before the feeder tops up and the next batch is taken."""
        self.version += 1
        self.outstanding -= groups
        self.step_log.append((start, self.now, groups * self.s.group_size))
        self.at(self.now + self.draws.loop(), self.loop_done)

    def loop_done(self) -> None:
        self.training = False
        self.top_up()
        self.try_step()

    def figures(self) -> dict[str, Any]:
        w = self.s.warm_steps
        t0, t1 = self.step_log[w - 1][1], self.step_log[-1][1]
        samples = sum(n for _, _, n in self.step_log[w:])
        sph = 3600 * samples / (t1 - t0)
        rollout_cap = 3600 * self.s.rollout_capacity()
        trainer_cap = 3600 * self.s.samples_per_step / self.s.step_s
        return {"samples_per_hour": sph,
                "trainer_idle": max(0.0, 1 - busy_share([(a, b) for a, b, _ in self.step_log], t0, t1)),
                "inference_idle": max(0.0, 1 - busy_share(self.run_spans, t0, t1)),
                "waste": self.wasted / max(1, self.generated),
                "bound_fraction": sph / min(rollout_cap, trainer_cap), "bound": min(rollout_cap, trainer_cap)}


def simulate(shape: SimShape, dists: Dists, max_staleness: int, reps: int, seed: int = 0) -> dict[str, Any]:
    """Mean figures over ``reps`` independent runs."""
    runs = [Sim(shape, dists, max_staleness, seed + k).run() for k in range(reps)]
    return {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}


# ------------------------------------------------------------------ from the bench
def _stage_samples(cell: dict[str, Any], stage: str) -> list[float]:
    """A bench cell's measured stage times; for EVAL those of the test runs (``eval_run_s``) where the bench
    recorded them (its groups share one diff, which the node tests once: the model's ``eval_dedup``)."""
    if stage == "eval" and cell.get("eval_run_s"):
        return list(cell["eval_run_s"])
    return list(cell["stage_s"][stage])


def from_bench(bench: dict[str, Any]) -> tuple[Dists, list[tuple[dict[str, Any], SimShape, Dists]]]:
    """The pooled stage, step and loop distributions of every bench cell (drawn at random for the shapes a user
    plans), and per cell its shape (its own means, the bench's spool settings) and its own measurements,
    replayed in order (:class:`Dists`)."""
    b = bench["shape"]
    cells = bench["cells"]
    pooled = {st: [x for c in cells for x in _stage_samples(c, st)] for st in STAGES}
    steps = [x / statistics.fmean(c["step_s"]) for c in cells for x in c["step_s"]]
    loops = [x for c in cells for x in c.get("loop_s", [])] or [0.0]
    dists = Dists(stage=pooled, step=steps, loop=loops)
    out = []
    for c in cells:
        own_stages = {st: _stage_samples(c, st) for st in STAGES}
        means = {st: statistics.fmean(own_stages[st]) for st in STAGES}
        shape = SimShape(nodes=1, init_workers=b["init_workers"], run_workers=b["run_workers"],
                         eval_workers=b["eval_workers"], llm_slots=b["llm_slots"], group_size=b["group_size"],
                         groups_per_step=b["groups_per_step"], means=means, step_s=statistics.fmean(c["step_s"]),
                         shard_max_age_s=b.get("shard_max_age_s", 0.2), poll_interval_s=b.get("poll_interval_s", 0.05),
                         eval_dedup="eval_run_s" in c, trainer_signal=bool(b.get("trainer_signal", False)),
                         eval_occupied_s=statistics.fmean(c["stage_s"]["eval"]) if "eval_run_s" in c else None,
                         steps=b["steps"], warm_steps=b["warm_steps"])
        own = Dists(stage=own_stages, step=c["step_s"], loop=c.get("loop_s") or [0.0], replay=True)
        out.append((c, shape, own))
    return dists, out


def validate(bench: dict[str, Any], reps: int) -> list[dict[str, Any]]:
    """Each bench cell against the model of it (replaying the cell's own measurements): samples/hour and the
    relative error."""
    _, cells = from_bench(bench)
    out = []
    for cell, shape, own in cells:
        sim = simulate(shape, own, cell["max_staleness"], reps)
        err = sim["samples_per_hour"] / cell["samples_per_hour"] - 1
        out.append({"ratio": cell["ratio"], "max_staleness": cell["max_staleness"],
                    "bench_samples_per_hour": cell["samples_per_hour"], "sim_samples_per_hour": round(sim["samples_per_hour"], 1),
                    "error": round(err, 4), "bench_trainer_idle": cell["trainer_idle"],
                    "sim_trainer_idle": round(sim["trainer_idle"], 4)})
    return out


# ------------------------------------------------------------------ user shapes
# Polar's TMax recipe (as issue 35 states it): 8 training GPUs beside 24 inference GPUs, 1,024 live sessions,
# 384 RUN workers. Assumed here (stated in the README): 8 rollout nodes of 48 RUN / 16 INIT / 16 EVAL workers,
# an SWE-style episode of 20 turns of 1,500 new prompt + 250 generated tokens at the bench's calibration
# (vLLM 8B on H100: 0.1 ms/prompt token, 25 ms/generated token) plus 2 s of tools per turn, INIT 30 s, EVAL 60 s,
# groups of 8, 64 groups per step (512 samples) of 35,600 tokens each, trained at 8 x 8,200 tokens/s.
TURN_S = 1500 * 1e-4 + 250 * 0.025 + 2.0
POLAR = SimShape(nodes=8, init_workers=16, run_workers=48, eval_workers=16, llm_slots=24 * 64, group_size=8,
                 groups_per_step=64, means={"init": 30.0, "run": 20 * TURN_S, "eval": 60.0},
                 step_s=512 * (600 + 20 * 1750) / (8 * 8200.0), shard_max_age_s=30.0, poll_interval_s=1.0,
                 steps=24, warm_steps=4)


def polar_cells(dists: Dists, reps: int, ages: tuple[float, ...] = (POLAR.shard_max_age_s,),
                staleness: tuple[int, ...] = (0, 1, 2, 4), trainer_signal: bool = True) -> list[dict[str, Any]]:
    """Polar's shape at each ``spool.shard_max_age_s`` in ``ages`` (the default 30 s, or a shorter one) and
    each ``max_staleness``, with the trainer-waiting signal or without it (the spool before it)."""
    ratio = POLAR.step_s / POLAR.rollout_step_s()
    tag = "" if trainer_signal else ", no signal"
    return [{"shape": f"polar {age:g}s{tag}", "ratio": round(ratio, 3), "max_staleness": s, "shard_max_age_s": age,
             "trainer_signal": trainer_signal,
             **simulate(replace(POLAR, shard_max_age_s=age, trainer_signal=trainer_signal), dists, s, reps)}
            for age in ages for s in staleness]


POLAR_NODE = replace(POLAR, nodes=1, llm_slots=48, groups_per_step=8)  # one of its 8 nodes


def node_scaling(dists: Dists, reps: int, nodes: list[int], ratio: float = 0.5, max_staleness: int = 2,
                 node: SimShape = POLAR_NODE) -> list[dict[str, Any]]:
    """Weak scaling: N copies of ``node`` (its workers, LLM slots and groups per step, times N); the trainer kept
    at ``ratio`` of the rollout time of a step, so the rollout side sets the pace.
    Efficiency = sph(N) / (N x sph(1))."""
    out = []
    base = None
    for n in nodes:
        shape = replace(node, nodes=n, llm_slots=n * node.llm_slots, groups_per_step=n * node.groups_per_step)
        shape = replace(shape, step_s=ratio * shape.rollout_step_s())
        sim = simulate(shape, dists, max_staleness, reps)
        base = base or sim["samples_per_hour"]
        out.append({"shape": f"{n} nodes", "nodes": n, "ratio": ratio, "max_staleness": max_staleness, **sim,
                    "efficiency": sim["samples_per_hour"] / (n * base)})
    return out


def ratio_one(bench: dict[str, Any], dists: Dists, reps: int, trainer_signal: bool = True) -> list[dict[str, Any]]:
    """The bench's shape with the trainer at exactly the rollout time of a step (ratio 1, from the stage means
    of every cell pooled, as the bench defines capacity: every sample's time in the stage, a sibling's wait for
    a shared EVAL included), synchronous and staleness 1, 2, 4: where issue 35's targets are stated."""
    _, cells = from_bench(bench)
    shape = replace(cells[0][1], trainer_signal=trainer_signal)
    occupied = statistics.fmean(x for c in bench["cells"] for x in c["stage_s"]["eval"])
    shape = replace(shape, means={st: statistics.fmean(dists.stage[st]) for st in STAGES},
                    eval_occupied_s=occupied if shape.eval_dedup else None)
    shape = replace(shape, step_s=shape.rollout_step_s())
    return [{"shape": "bench, ratio 1", "ratio": 1.0, "max_staleness": s, **simulate(shape, dists, s, reps)}
            for s in (0, 1, 2, 4)]


def print_cells(title: str, cells: list[dict[str, Any]]) -> None:
    print(f"== {title}")
    print(f"  {'shape':>20} {'ratio':>6} {'staleness':>9} {'samples/h':>10} {'trainer idle':>12} {'infer idle':>10} "
          f"{'waste':>6} {'of bound':>8}" + ("  efficiency" if "efficiency" in cells[0] else ""))
    for c in cells:
        print(f"  {c.get('shape', ''):>20} {c['ratio']:6.2f} {c['max_staleness']:9d} {c['samples_per_hour']:10.0f} "
              f"{c['trainer_idle']:12.1%} {c['inference_idle']:10.1%} {c['waste']:6.1%} {c['bound_fraction']:8.0%}"
              + (f"  {c['efficiency']:10.1%}" if "efficiency" in c else ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bench", type=Path, required=True, help="the --json-out file of scripts/bench_overlap.py")
    p.add_argument("--reps", type=int, default=20, help="independent runs averaged per cell")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = p.parse_args(argv)
    try:
        bench = json.loads(args.bench.read_text())
        dists, _ = from_bench(bench)
    except (OSError, ValueError, KeyError) as exc:
        p.error(f"--bench: cannot read a bench_overlap --json-out file from {args.bench} ({exc!r})")
    checks = validate(bench, args.reps)
    print("== validation against the bench's cells (samples/hour)")
    for v in checks:
        print(f"  ratio {v['ratio']:5.2f} staleness {v['max_staleness']}: bench {v['bench_samples_per_hour']:8.0f}  "
              f"model {v['sim_samples_per_hour']:8.0f}  error {v['error']:+6.1%}   trainer idle bench "
              f"{v['bench_trainer_idle']:6.1%} model {v['sim_trainer_idle']:6.1%}")
    worst = max(abs(v["error"]) for v in checks)
    within = sum(abs(v["error"]) <= 0.10 for v in checks)
    print(f"  {within} of {len(checks)} cells within 10 %, worst error {worst:.1%} (target: every cell <= 10 %)")
    at1 = ratio_one(bench, dists, args.reps)
    print_cells("the bench's shape at ratio 1 (targets: staleness 2 >= 1.8x synchronous, trainer idle and waste "
                "<= 5 %)", at1)
    speedup = at1[2]["samples_per_hour"] / at1[0]["samples_per_hour"]
    print(f"  staleness 2 / synchronous = {speedup:.2f}x, trainer idle {at1[2]['trainer_idle']:.1%}, "
          f"waste {at1[2]['waste']:.1%}")
    polar = polar_cells(dists, max(2, args.reps // 4))
    polar += polar_cells(dists, max(2, args.reps // 4), ages=(30.0, 2.0), staleness=(2,), trainer_signal=False)
    print_cells("Polar TMax recipe (8 training + 24 inference GPUs, 384 RUN workers; assumptions in the source; "
                "spool.shard_max_age_s 30 s, the default; then without the trainer-waiting signal at 30 s and 2 s)",
                polar)
    scaling = node_scaling(dists, max(2, args.reps // 4), args.nodes)
    print_cells("rollout nodes (weak scaling, staleness 2, trainer at 0.5 of the rollout time)", scaling)
    at16 = next((c["efficiency"] for c in scaling if c["nodes"] == 16), None)
    print(json.dumps({"sim": "overlap", "validation": checks, "worst_error": round(worst, 4),
                      "ratio_one": {"async_over_sync": round(speedup, 3), "trainer_idle": round(at1[2]["trainer_idle"], 4),
                                    "waste": round(at1[2]["waste"], 4)},
                      "efficiency_16_nodes": None if at16 is None else round(at16, 4),
                      "cells": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in c.items()}
                                for c in at1 + polar + scaling]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
