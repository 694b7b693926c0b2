#!/usr/bin/env python3
"""Benchmark: the INIT -> RUN -> EVAL pipeline against a one-worker-per-episode loop, and the spool
alone under 1..16 rollout-node processes.

Part 1 (same machine, same run, side by side). Both variants get the same budget of live
sandboxes (``--sandboxes``), the same task mix (the built-in tasks, ``--episodes`` episodes, one
sample each) with real test runs in EVAL (the real harness, real bwrap sandboxes), the same
scripted agent and the same LLM stand-in:

- *monolithic*: ``--sandboxes`` workers; each claims a task and runs INIT, RUN and EVAL itself.
- *pipeline*: the real :class:`RolloutNode`: ``--init-workers`` INIT workers (they hold no
  sandbox), ``--eval-workers`` EVAL workers and ``sandboxes - eval_workers`` RUN workers.

The agent (identical in both) takes ``--turns`` turns; each turn is one LLM call and one real tool
call in the sandbox (``ls``, ``grep``, ``python3 -c``, ``git status``); the last turn applies the
gold patch, so EVAL runs the task's real tests and every reward must be 1.

The LLM stand-in models one inference server: ``--llm-slots`` sequences decode at once (a
request waits for a free slot); a request costs ``prefill_s_per_1k`` per 1,000 *new* prompt tokens
(prefix caching: earlier turns are cached) plus ``per_token_s`` per generated token. A turn sends
``--obs-tokens`` new tokens and generates ``--gen-tokens`` tokens. It sleeps instead of computing,
so the CPUs stay with INIT and EVAL, as on a rollout node whose LLM is on GPU nodes.

INIT on a cluster reads the repository (and, on first use, the image) from a shared filesystem;
``--init-io-s`` adds that latency to every INIT (a sleep; 0 disables it; the local git checkout
itself is real). The shared filesystem cannot exist on one machine, so this sleep stands in for it
(a named fake). Its default, 3 s, is below what staging one 1.1 GB image into a cold node cache took
on this machine's *local* disk (5.1-8.1 s, ``scripts/bench_tools.py --only init``), and task sets
in the SWE-bench format carry one image per instance, so cold stagings are the normal case. With a
purely local INIT there is little to gain: the sandbox budget is the same in both variants and INIT
is the only stage that holds no sandbox (measured: 1.22x steady with ``--init-io-s 0``).

Figures: per-stage p50/p95 (INIT, RUN, EVAL) first, then episodes/min of both variants (steady
state: over the middle half of the completions, which leaves out filling and draining the
stages; end to end also printed), their ratio (target >= 1.5x), and the pipeline's fraction of its theoretical bound (target >= 85%):
the capacity of its slowest stage, ``min(init_workers / mean INIT, run_workers / mean RUN,
eval_workers / mean EVAL, llm_slots / LLM time per episode)``, with the mean stage times measured
in that same run.

Part 2: the spool alone. N processes (1, 2, 4, 8, 16) each loop like a rollout node without
sandboxes: heartbeat, claim a task, write a group of ``--group-size`` synthetic trajectories with
``add_group``, ``finish_task`` once the shard is published. Throughput (tasks/s, all processes),
scaling efficiency = throughput(N) / (N x throughput(1)), and CPU time per task (summed over the
processes): on a 2-core machine throughput above 2 processes is bounded by the CPUs, so a flat
CPU cost per task is what shows that the spool itself adds no coordination cost as claimers grow
(on a cluster each process is on its own node).

Usage: scripts/bench_pipeline.py [--episodes 24] [--sandboxes 8] ... [--skip-spool] [--skip-pipeline]
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hpc.config import RunConfig, load_config
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status, Trajectory
from rollout_node.pipeline.bindings import RealTaskOps
from rollout_node.pipeline.claim import read_claim
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.metrics import percentile
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput
from rollout_node.pipeline.sizing import Workers
from rollout_node.pipeline.stages import Stages
from rollout_node.tasks import load_tasks
from rollout_node.tasks.instance import TaskInstance

TOOLS = ("ls -la", "grep -rn 'def ' --include=*.py . | head -20", "python3 -c 'import sys; print(sys.version)'",
         "git status --short")


# ----------------------------------------------------------------------------------------- LLM stand-in
@dataclass
class LLMStandIn:
    """One inference server: fixed slots, prefill cost per new prompt token, per-token latency."""

    slots: int
    prefill_s_per_1k: float
    per_token_s: float

    def __post_init__(self) -> None:
        self.sem = threading.BoundedSemaphore(self.slots)
        self.lock = threading.Lock()
        self.busy_s = 0.0

    def cost(self, new_prompt_tokens: int, gen_tokens: int) -> float:
        return self.prefill_s_per_1k * new_prompt_tokens / 1000 + self.per_token_s * gen_tokens

    def generate(self, new_prompt_tokens: int, gen_tokens: int) -> None:
        with self.sem:
            t = self.cost(new_prompt_tokens, gen_tokens)
            time.sleep(t)
            with self.lock:
                self.busy_s += t


class BenchPolicy:
    """The bench agent: ``turns`` x (LLM call + real tool call); the last turn applies the gold patch."""

    def __init__(self, llm: LLMStandIn, turns: int, obs_tokens: int, gen_tokens: int) -> None:
        self.llm, self.turns, self.obs_tokens, self.gen_tokens = llm, turns, obs_tokens, gen_tokens

    def close(self) -> None:
        return None

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        ctx.transcript.add_context([5] * self.obs_tokens)
        for turn in range(self.turns):
            self.llm.generate(self.obs_tokens, self.gen_tokens)
            ctx.transcript.add_generated([7] * self.gen_tokens, [-0.5] * self.gen_tokens, [0] * self.gen_tokens)
            if turn == self.turns - 1:
                data = base64.b64encode(ctx.task.patch.encode()).decode()
                command = f"echo {data} | base64 -d | git apply -"
            else:
                command = TOOLS[turn % len(TOOLS)]
            result = ctx.sandbox.run(command, timeout_s=ctx.tool_timeout_s())
            ctx.transcript.add_context([5] * min(self.obs_tokens, 1 + len(result.output) // 4))
        return EpisodeOutput(status=Status.OK)


class BenchOps(RealTaskOps):
    """The real task ops plus the shared-filesystem latency stand-in in INIT."""

    init_io_s = 0.0

    def prepare(self, task: TaskInstance, workdir: Path, timeout_s: float | None = None) -> None:
        time.sleep(self.init_io_s)
        super().prepare(task, workdir, timeout_s)


# ----------------------------------------------------------------------------------------- part 1
def make_run(root: Path, name: str, episodes: int) -> tuple[RunPaths, RunConfig]:
    cfg = load_config(None, [
        "trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent", "rollout.policy=scripted",
        "algorithm.group_size=1", "algorithm.drop_zero_variance=false", "spool.poll_interval_s=0.05",
        "spool.heartbeat_interval_s=1", "spool.shard_max_age_s=1", "spool.max_ready_shards=100000",
        "rollout.metrics_interval_s=5", "rollout.max_retries=0", "rollout.queue_size=4",
        f"sandbox.scratch_dir={root / 'scratch'}",
    ])
    paths = create_run(root / name, cfg)
    ids = [t.instance_id for t in load_tasks("builtin")]
    tasks = [{"task_id": f"{ids[i % len(ids)]}@e{i // len(ids)}", "instance_id": ids[i % len(ids)],
              "group_size": 1} for i in range(episodes)]
    Spool(paths.root, cfg.spool).put_tasks(tasks)
    return paths, cfg


def run_pipeline(root: Path, args: argparse.Namespace, llm: LLMStandIn) -> dict[str, Any]:
    paths, cfg = make_run(root, "pipeline", args.episodes)
    ops = BenchOps(paths, cfg)
    ops.init_io_s = args.init_io_s
    ops._ensure_repos()
    workers = Workers(init=args.init_workers, run=args.sandboxes - args.eval_workers, eval=args.eval_workers)
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), ops,
                       BenchPolicy(llm, args.turns, args.obs_tokens, args.gen_tokens),
                       NodeOptions(node_id="bench", workers=workers, scratch=root / "node-p", once=True))
    t0 = time.monotonic()
    summary = node.run()
    wall = time.monotonic() - t0
    records = [json.loads(line) for line in (paths.metrics / "rollout-bench.jsonl").read_text().splitlines()]
    episodes = [r for r in records if r["kind"] == "episode"]
    return {"wall_s": wall, "episodes": len(episodes), "summary": summary, "records": episodes, "workers": workers,
            "rewards": [r["reward"] for r in episodes], "done_at": [r["t"] for r in episodes]}


def run_monolithic(root: Path, args: argparse.Namespace, llm: LLMStandIn) -> dict[str, Any]:
    paths, cfg = make_run(root, "monolithic", args.episodes)
    ops = BenchOps(paths, cfg)
    ops.init_io_s = args.init_io_s
    ops._ensure_repos()
    spool = Spool(paths.root, cfg.spool)
    policy = BenchPolicy(llm, args.turns, args.obs_tokens, args.gen_tokens)
    stages = Stages(cfg, ops, policy, root / "node-m", lambda: 0)
    rewards: list[float | None] = []
    done_at: list[float] = []
    lock = threading.Lock()

    def worker(k: int) -> None:
        wid = f"mono-{k}"
        with spool.writer(wid) as writer:
            while (lease := spool.claim_task(wid)) is not None:
                claim = read_claim(lease, ops.parse)
                assert claim.task is not None, claim.error
                group = Group(claim=claim, size=1, image=ops.image(claim.task))
                ep = Episode(group, 0, 0, 0)
                ep.enter("init")
                stages.init(ep)
                ep.leave("run_queue")
                ep.enter("run")
                stages.run(ep)
                ep.leave("eval_queue")
                ep.enter("eval")
                outcome = stages.evaluate(ep, lambda: True)
                ep.leave("done")
                writer.add_group([ep.trajectory(Status.OK, outcome.reward)])
                writer.flush()
                spool.finish_task(lease)
                with lock:
                    rewards.append(outcome.reward)
                    done_at.append(time.time())

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(args.sandboxes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"wall_s": time.monotonic() - t0, "episodes": len(rewards), "rewards": rewards, "done_at": done_at}


def steady_rate(done_at: list[float]) -> float:
    """Episodes/min over the middle half of the completions: leaves out filling and draining the stages."""
    ts = sorted(done_at)
    lo, hi = len(ts) // 4, (3 * len(ts)) // 4
    return 60 * (hi - lo) / (ts[hi] - ts[lo])


def stage_stats(records: list[dict[str, Any]]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for stage in ("init", "run", "eval"):
        values = [r["timings"][f"{stage}_s"] for r in records if f"{stage}_s" in r["timings"]]
        out[stage] = (percentile(values, 0.5) or 0.0, percentile(values, 0.95) or 0.0, statistics.fmean(values))
    return out


def part1(args: argparse.Namespace) -> None:
    print(f"== pipeline vs one worker per episode: {args.episodes} episodes, {args.sandboxes} live sandboxes, "
          f"{args.turns} turns, LLM {args.llm_slots} slots, prefill {args.prefill_s_per_1k}s/1k, "
          f"{args.per_token_s * 1000:.0f} ms/token, {args.obs_tokens} new prompt + {args.gen_tokens} generated "
          f"tokens per turn, INIT I/O stand-in {args.init_io_s}s")
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-") as tmp:
        root = Path(tmp)
        llm = LLMStandIn(args.llm_slots, args.prefill_s_per_1k, args.per_token_s)
        pipe = run_pipeline(root, args, llm)
        llm_mono = LLMStandIn(args.llm_slots, args.prefill_s_per_1k, args.per_token_s)
        mono = run_monolithic(root, args, llm_mono)
    stats = stage_stats(pipe["records"])
    for stage, (p50, p95, mean) in stats.items():
        print(f"  {stage.upper():4s} p50 {p50:6.2f} s   p95 {p95:6.2f} s   mean {mean:6.2f} s")
    for name, res in (("pipeline", pipe), ("monolithic", mono)):
        bad = [r for r in res["rewards"] if r != 1.0]
        assert res["episodes"] == args.episodes and not bad, f"{name}: {res['episodes']} episodes, rewards {bad}"
    rate_p, rate_m = steady_rate(pipe["done_at"]), steady_rate(mono["done_at"])
    e2e_p, e2e_m = 60 * pipe["episodes"] / pipe["wall_s"], 60 * mono["episodes"] / mono["wall_s"]
    w: Workers = pipe["workers"]
    llm_per_episode = args.turns * llm.cost(args.obs_tokens, args.gen_tokens)
    caps = {"INIT": w.init / stats["init"][2], "RUN": w.run / stats["run"][2], "EVAL": w.eval / stats["eval"][2],
            "LLM": args.llm_slots / llm_per_episode}
    bound_stage = min(caps, key=lambda k: caps[k])
    bound = 60 * caps[bound_stage]
    print("  stage capacity (episodes/min): " + ", ".join(f"{k} {60 * v:.1f}" for k, v in caps.items()))
    print(f"  monolithic: {rate_m:6.1f} episodes/min steady ({e2e_m:.1f} end to end, {mono['wall_s']:.1f} s)")
    print(f"  pipeline:   {rate_p:6.1f} episodes/min steady ({e2e_p:.1f} end to end, {pipe['wall_s']:.1f} s; "
          f"workers init={w.init} run={w.run} eval={w.eval})")
    print(f"  ratio pipeline/monolithic: {rate_p / rate_m:.2f}x steady, {e2e_p / e2e_m:.2f}x end to end "
          "(target >= 1.5x)")
    print(f"  pipeline / bound ({bound_stage}, {bound:.1f}/min): {rate_p / bound:.0%} (target >= 85%)")


# ----------------------------------------------------------------------------------------- part 2
def _traj(task_id: str, i: int, n_tokens: int) -> Trajectory:
    gen = n_tokens // 2
    mask = np.r_[np.zeros(n_tokens - gen, np.int8), np.ones(gen, np.int8)]
    return Trajectory(trajectory_id=f"{task_id}:{i}", task_id=task_id, group_id=f"{task_id}:g", sample_index=i,
                      token_ids=np.arange(n_tokens, dtype=np.int32) % 1000, loss_mask=mask,
                      logprobs=np.where(mask == 1, -0.5, 0.0).astype(np.float32),
                      policy_versions=np.where(mask == 1, 0, -1).astype(np.int32), reward=1.0)


def _spool_worker(run_dir: str, k: int, group_size: int, n_tokens: int, duration_s: float, out: Any,
                  start: Any) -> None:
    cfg = load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.heartbeat_interval_s=1",
                             "spool.shard_max_age_s=1"])
    spool = Spool(run_dir, cfg.spool)
    wid = f"node-{k}"
    done, waiting = 0, []
    start.wait()  # every process is imported and ready: they all start together
    cpu0 = time.process_time()
    deadline = time.monotonic() + duration_s
    with spool.writer(wid) as writer:
        while time.monotonic() < deadline:
            lease = spool.claim_task(wid)
            if lease is None:
                break
            writer.add_group([_traj(lease.task_id, i, n_tokens) for i in range(group_size)])
            waiting.append((len(writer.published), lease))
            if writer.pending() == 0:
                for _, lz in waiting:
                    spool.finish_task(lz)
                done += len(waiting)
                waiting = []
    for _, lz in waiting:  # the writer closed: every shard is published
        spool.finish_task(lz)
    out.put((done + len(waiting), time.monotonic() - (deadline - duration_s), time.process_time() - cpu0))


def part2(args: argparse.Namespace) -> None:
    print(f"== spool alone: claim + add_group({args.group_size} x {args.tokens} tokens) + finish, "
          f"{args.spool_seconds:.0f} s per point")
    base = None
    ctx = mp.get_context("spawn")
    for n in args.processes:
        with tempfile.TemporaryDirectory(prefix="bench-spool-") as tmp:
            cfg = load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0"])
            paths = create_run(Path(tmp) / "run", cfg)
            Spool(paths.root, cfg.spool).put_tasks({"task_id": f"t{i}"} for i in range(args.spool_tasks))
            out, start = ctx.Queue(), ctx.Barrier(n)
            procs = [ctx.Process(target=_spool_worker, args=(str(paths.root), k, args.group_size, args.tokens,
                                                            args.spool_seconds, out, start)) for k in range(n)]
            for p in procs:
                p.start()
            results = [out.get() for _ in procs]
            for p in procs:
                p.join()
            tasks = sum(r[0] for r in results)
            rate = tasks / max(r[1] for r in results)
            cpu_ms = 1000 * sum(r[2] for r in results) / max(1, tasks)
            base = base or rate
            print(f"  {n:3d} processes: {rate:8.1f} tasks/s  ({rate * args.group_size:8.1f} trajectories/s)  "
                  f"efficiency {rate / (n * base):5.0%}  CPU {cpu_ms:5.2f} ms/task")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=48)
    p.add_argument("--sandboxes", type=int, default=8, help="live-sandbox budget of both variants")
    p.add_argument("--init-workers", type=int, default=8)
    p.add_argument("--eval-workers", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--llm-slots", type=int, default=8)
    p.add_argument("--prefill-s-per-1k", type=float, default=0.05)
    p.add_argument("--per-token-s", type=float, default=0.01)
    p.add_argument("--obs-tokens", type=int, default=400)
    p.add_argument("--gen-tokens", type=int, default=60)
    p.add_argument("--init-io-s", type=float, default=3.0)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--spool-seconds", type=float, default=4.0)
    p.add_argument("--spool-tasks", type=int, default=20000)
    p.add_argument("--skip-pipeline", action="store_true")
    p.add_argument("--skip-spool", action="store_true")
    args = p.parse_args(argv)
    if not args.skip_pipeline:
        part1(args)
    if not args.skip_spool:
        part2(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
