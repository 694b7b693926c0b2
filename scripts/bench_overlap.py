#!/usr/bin/env python3
"""Benchmark: trainer idle time and throughput of asynchronous against synchronous RL when the trainer and the
LLM are on accelerators and the sandboxes on CPUs (issue 35).

Real parts: the rollout node (:class:`RolloutNode`: INIT/RUN/EVAL workers, bwrap sandboxes, the built-in tasks'
real tests in EVAL, the staleness guard that reads ``policy/LATEST``), the spool, and the real trainer loop
(:class:`train_node.trainer.loop.Trainer`: feeder, consumer, batch source with prefetch, publisher writing
``policy/vNNNNNN`` + ``LATEST``, metrics, the final checkpoint). Two named stand-ins take time without taking CPU:

- :class:`InferenceStandIn` (the inference server): ``--llm-slots`` requests in service at once; a request
  answers fixed token IDs after ``prefill_s`` per new prompt token + ``decode_s`` per generated token; the tokens
  carry the version ``policy/LATEST`` names when the request is admitted (a server that reloads every published
  version at once). Calibration (real seconds, then x ``--time-scale``): vLLM serving Llama 3 8B on one H100, the
  profile of vLLM's v0.6.0 performance post (https://blog.vllm.ai/2024/09/05/perf-update.html: Llama 8B on
  1 x H100, ShareGPT, TPOT measured at 32 QPS); the figures used are assumptions of that order, not read off
  its plots: 25 ms per generated token (a batch of ~64 agent sequences) and 0.1 ms per new prompt token
  (~10,000 prompt tokens/s). One agent turn = ``--obs-tokens`` new prompt tokens + ``--gen-tokens`` generated.
- :class:`SleepEngine` (the GPU trainer engine): sleeps ``seconds_per_token`` x the tokens of the step's
  micro-batches and returns a zero loss; its "weights" are one small tensor, published by the real
  publisher. The seconds per token are set from the cell's ratio: ``ratio x (rollout time of a step) /
  (tokens per step)``, where the rollout time of a step is ``samples per step x RUN time of an episode /
  RUN workers`` from the stand-in's delays. A real trainer's figure (for the model, ``sim_overlap.py``): an 8B
  model at 6 x 8.03e9 FLOPs per trained token on H100s (989 dense bf16 TFLOP/s) at 40 % MFU (the Llama 3
  paper reports 38-43 % on H100s) trains ~8,200 tokens/s per GPU.

Sweep: ``--ratios`` (trainer step time / rollout time of a step) x ``--staleness`` (``algorithm.max_staleness``;
0 = synchronous: ``trainer.max_tasks_outstanding = groups_per_step``, no prefetch; S > 0: ``(S + 1) x
groups_per_step`` outstanding, prefetch on). Every cell is its own run directory and process; ``--parallel``
cells run side by side. The trainer raises ``control/TRAINER_WAITING`` while it waits for a batch and the node
seals its open shard when it sees it (as in production); ``--no-trainer-signal`` measures the spool without it
(seal by age, when full, or when the node is idle).

Per cell, over the steady window (the steps after ``--warm-steps``): samples/hour trained, trainer idle (the
share of the window not inside a train step, :func:`hpc.overlap.trainer_idle`), inference idle (time with no request in service
over the window), waste (samples dropped as stale by the consumer or cancelled as stale by the rollout node,
over the samples rolled out), and the bound: ``min(rollout capacity, trainer capacity)``, both measured in the
cell: rollout capacity = the slowest of INIT, RUN, EVAL (workers / mean stage time) and the LLM stand-in
(slots / LLM seconds per sample); trainer capacity = samples per step / mean step time. Where the trainer's idle
time went (:func:`idle_decomposition`, from the stand-in engine's step times, the batch source's waits and the
feeder's puts, noted by thin wrappers around the real source and spool): the phase the batch's last sample was
in (not issued, claim, INIT, RUN queue, RUN, EVAL queue, EVAL), the handoff after EVAL (shard seal, poll,
assembly), or the trainer loop's own work; beside it the floor, 1 - rollout capacity / trainer capacity, the
idle no scheduling can avoid. The last line is one JSON object with a ``cells`` list.

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_overlap.py [--steps 8] [--ratios 0.25 0.5 1 2 4]
        [--staleness 0 1 2 4] [--parallel 4] [--json-out FILE]
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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))  # spawned workers import this script by its bare name

from hpc.config import load_config  # noqa: E402
from hpc.metrics import read_metrics  # noqa: E402
from hpc.overlap import busy_share, trainer_idle  # noqa: E402
from hpc.records import read_policy_latest  # noqa: E402
from hpc.rundir import create_run  # noqa: E402
from hpc.spool import ConsumerSpool, Spool  # noqa: E402
from hpc.trajectory import Status  # noqa: E402
from rollout_node.pipeline.node import NodeOptions, RolloutNode  # noqa: E402
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput  # noqa: E402
from rollout_node.pipeline.sizing import Workers  # noqa: E402
from rollout_node.tasks import load_tasks  # noqa: E402
from scripts.bench_pipeline import TOOLS, BenchOps, stage_stats  # noqa: E402
from train_node.trainer.checkpoint import CheckpointMeta  # noqa: E402
from train_node.trainer.engine import StepResult  # noqa: E402
from train_node.trainer.loop import Lead, Options, Trainer  # noqa: E402
from train_node.trainer.loss import LossSums  # noqa: E402
from train_node.trainer.packing import MicroBatch  # noqa: E402
from train_node.trainer.source import BatchSource  # noqa: E402

# Real-world calibration (seconds), scaled by --time-scale: see the module docstring.
PREFILL_S_PER_TOKEN = 1e-4  # vLLM, 8B, H100: ~10k prompt tokens/s per request
DECODE_S_PER_TOKEN = 0.025  # vLLM, 8B, H100: ~25 ms per generated token at a batch of ~64
GPU_TRAIN_TOKENS_PER_S = 989e12 * 0.40 / (6 * 8.03e9)  # 8B, H100 bf16 dense at 40 % MFU: ~8.2k tokens/s/GPU
PROMPT_TOKEN, GEN_TOKEN = 5, 7


@dataclass
class Shape:
    """What every cell of one bench run shares (the rollout side and the stand-ins' calibration)."""

    steps: int = 7
    warm_steps: int = 2
    group_size: int = 2
    groups_per_step: int = 4
    init_workers: int = 4
    run_workers: int = 8
    eval_workers: int = 3
    llm_slots: int = 8
    turns: int = 2
    prompt_tokens: int = 600
    obs_tokens: int = 1500
    gen_tokens: int = 250
    time_scale: float = 0.25
    shard_max_age_s: float = 0.2  # spool.shard_max_age_s: a complete group waits up to this for its shard's seal
    poll_interval_s: float = 0.05  # spool.poll_interval_s
    trainer_signal: bool = True  # control/TRAINER_WAITING (--no-trainer-signal: the trainer never raises it)

    @property
    def prefill_s(self) -> float:
        return PREFILL_S_PER_TOKEN * self.time_scale

    @property
    def decode_s(self) -> float:
        return DECODE_S_PER_TOKEN * self.time_scale

    @property
    def llm_s_per_turn(self) -> float:
        return self.prefill_s * self.obs_tokens + self.decode_s * self.gen_tokens

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.groups_per_step

    @property
    def tokens_per_sample(self) -> int:
        return self.prompt_tokens + self.turns * (self.gen_tokens + self.obs_tokens)

    def rollout_step_s(self) -> float:
        """The stand-ins' rollout time of one step: its samples through the RUN workers, LLM time only."""
        return self.samples_per_step * self.turns * self.llm_s_per_turn / self.run_workers

    def trainer_s_per_token(self, ratio: float) -> float:
        return ratio * self.rollout_step_s() / (self.samples_per_step * self.tokens_per_sample)


# ----------------------------------------------------------------------------------------- inference stand-in
class InferenceStandIn:
    """Named stand-in for one inference server on a GPU (see the module docstring). Thread-safe."""

    def __init__(self, shape: Shape, latest: Any) -> None:
        self.shape, self.latest = shape, latest
        self.slots = threading.BoundedSemaphore(shape.llm_slots)
        self.lock = threading.Lock()
        self.in_service = 0
        self.busy: list[list[float]] = []  # [start, end] wall-clock intervals with >= 1 request in service
        self.versions: set[int] = set()
        self.requests = 0

    def generate(self, new_prompt_tokens: int, stop: threading.Event) -> int | None:
        """Serve one request; returns the policy version of its tokens, or None when ``stop`` cut it short."""
        with self.slots:
            version = int(self.latest())
            with self.lock:
                self.in_service += 1
                if self.in_service == 1:
                    self.busy.append([time.time(), float("inf")])
                self.versions.add(version)
                self.requests += 1
            try:
                cut = stop.wait(self.shape.prefill_s * new_prompt_tokens + self.shape.decode_s * self.shape.gen_tokens)
            finally:
                with self.lock:
                    self.in_service -= 1
                    if self.in_service == 0:
                        self.busy[-1][1] = time.time()
        return None if cut else version

    def idle_fraction(self, start: float, end: float) -> float:
        """Share of [start, end] with no request in service."""
        with self.lock:
            spans = [(a, min(b, time.time())) for a, b in self.busy]
        return 1.0 - busy_share(spans, start, end)


class OverlapPolicy:
    """The bench agent: ``turns`` x (one stand-in LLM request + one real tool call in the sandbox); the last turn
    applies the gold patch, so EVAL runs the task's real tests. Records fixed token IDs, logprob -0.5 of kind
    ``processed`` at temperature 1 (trainable), and the version the stand-in served each turn with."""

    def __init__(self, server: InferenceStandIn, shape: Shape) -> None:
        self.server, self.shape = server, shape

    def close(self) -> None:
        return None

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        s = self.shape
        ctx.transcript.add_context([PROMPT_TOKEN] * s.prompt_tokens)
        new_tokens = s.prompt_tokens
        for turn in range(s.turns):
            version = self.server.generate(new_tokens, ctx.stop_event)
            if version is None or ctx.should_stop():
                break
            ctx.transcript.add_generated([GEN_TOKEN] * s.gen_tokens, [-0.5] * s.gen_tokens, [version] * s.gen_tokens)
            if turn == s.turns - 1:
                command = f"echo {base64.b64encode(ctx.task.patch.encode()).decode()} | base64 -d | git apply -"
            else:
                command = TOOLS[turn % len(TOOLS)]
            ctx.sandbox.run(command, timeout_s=ctx.tool_timeout_s())
            ctx.transcript.add_context([PROMPT_TOKEN] * s.obs_tokens)
            new_tokens = s.obs_tokens
        return EpisodeOutput(status=Status.OK, sampling={"temperature": 1.0}, logprob_kind="processed")


# ----------------------------------------------------------------------------------------- trainer stand-in
class SleepEngine:
    """Named stand-in for the GPU trainer engine: a step sleeps ``seconds_per_token`` per token it is given.
    ``spans`` keeps the wall-clock [start, end] of every step (the bench's idle decomposition)."""

    def __init__(self, seconds_per_token: float) -> None:
        self.seconds_per_token = seconds_per_token
        self.weights = {"model.embed_tokens.weight": torch.zeros(8, 8)}
        self.spans: list[tuple[float, float]] = []

    def train_step(self, micro_batches: list[MicroBatch]) -> StepResult:
        t0, wall0 = time.perf_counter(), time.time()
        tokens = sum(int(mb.input_ids.size) for mb in micro_batches)
        time.sleep(self.seconds_per_token * tokens)
        self.spans.append((wall0, time.time()))
        self.weights["model.embed_tokens.weight"] += 1.0  # every version's weights differ
        loss_tokens = float(sum(float(mb.mask.sum()) for mb in micro_batches))
        return StepResult(sums=LossSums(tokens=loss_tokens), grad_norm=None, lr=0.0, tokens=tokens,
                          seconds=time.perf_counter() - t0)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.weights.items()}

    def save(self, save_dir: Path, client_state: dict[str, Any]) -> None:
        save_dir.mkdir(parents=True, exist_ok=True)
        torch.save({"weights": self.weights, "client_state": client_state}, save_dir / "standin.pt")


class IssueClock:
    """The trainer's spool as the feeder sees it, noting when each task was put (the bench's idle decomposition);
    every other call goes to the real spool unchanged."""

    def __init__(self, spool: ConsumerSpool) -> None:
        self.spool = spool
        self.issued: dict[str, float] = {}

    def put_tasks(self, tasks: list[dict[str, Any]]) -> int:
        now = time.time()
        for task in tasks:
            self.issued.setdefault(str(task["task_id"]), now)
        return self.spool.put_tasks(tasks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spool, name)


class WaitClock:
    """The trainer's batch source, noting the wall-clock [start, end] of every wait for a batch (the bench's idle
    decomposition); every other call goes to the real source unchanged."""

    def __init__(self, source: BatchSource) -> None:
        self.source = source
        self.waits: list[tuple[float, float]] = []

    def get(self, timeout_s: float) -> tuple[Any, float]:
        t0 = time.time()
        try:
            return self.source.get(timeout_s)
        finally:
            self.waits.append((t0, time.time()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.source, name)


class NoWaitSignal:
    """In place of the trainer's :class:`~train_node.trainer.source.WaitSignal` (``--no-trainer-signal``): the
    trainer never says it waits, so the nodes seal shards by age, when full or when idle, as before the signal."""

    def begin(self, step: int, policy_version: int) -> None:
        return None

    def end(self) -> None:
        return None


class StandInTrainer(Trainer):
    """The real trainer loop with :class:`SleepEngine` in place of the DeepSpeed engine, its spool behind an
    :class:`IssueClock` and its batch source behind a :class:`WaitClock`."""

    seconds_per_token = 0.0
    trainer_signal = True

    def _build_engine(self, meta: CheckpointMeta | None) -> Any:
        return SleepEngine(self.seconds_per_token)

    def _setup_rank0(self, meta: CheckpointMeta | None) -> Lead:
        lead = super()._setup_rank0(meta)
        if not self.trainer_signal:
            lead.waiting = NoWaitSignal()  # type: ignore[assignment]
        self.issue_clock = IssueClock(lead.spool)
        lead.spool = self.issue_clock  # type: ignore[assignment]
        return lead

    def setup(self) -> None:
        super().setup()
        self.wait_clock = WaitClock(self.lead.batches)
        self.lead.source = self.wait_clock  # type: ignore[assignment]


def write_model_config(path: Path) -> None:
    """The config.json the publisher copies into every version (a tiny Qwen2; no weights are loaded)."""
    from transformers import Qwen2Config

    Qwen2Config(vocab_size=64, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=1,
                num_key_value_heads=1, tie_word_embeddings=True).save_pretrained(str(path))


# ----------------------------------------------------------------------------------------- one cell
def cell_overrides(shape: Shape, max_staleness: int, root: Path) -> list[str]:
    outstanding = shape.groups_per_step * (max_staleness + 1)
    return [
        "trainer.precision=fp32", "slurm.train.gpus_per_node=0", f"model.path={root / 'model'}",
        "rollout.policy=scripted", f"algorithm.group_size={shape.group_size}",
        f"algorithm.groups_per_step={shape.groups_per_step}", f"algorithm.max_staleness={max_staleness}",
        "algorithm.drop_zero_variance=false", "algorithm.kl_coef=0", f"trainer.total_steps={shape.steps}",
        f"trainer.max_tasks_outstanding={outstanding}", f"trainer.prefetch={'true' if max_staleness else 'false'}",
        f"trainer.checkpoint_every={shape.steps + 1}", "trainer.publish_every=1",
        f"tasks.epochs={1 + (shape.steps + max_staleness + 2) * shape.groups_per_step * 2 // 16}",  # never runs dry
        "tasks.source=builtin",
        f"spool.poll_interval_s={shape.poll_interval_s}", "spool.heartbeat_interval_s=1",
        f"spool.shard_max_age_s={shape.shard_max_age_s}",
        "rollout.metrics_interval_s=5", "rollout.max_retries=0", "rollout.queue_size=16",
        "rollout.drain_timeout_s=2", f"sandbox.scratch_dir={root / 'scratch'}",
    ]


def run_cell(shape: Shape, ratio: float, max_staleness: int) -> dict[str, Any]:
    """One cell in this process: a fresh run directory, a rollout node thread, the trainer in this thread."""
    with tempfile.TemporaryDirectory(prefix=f"bench-overlap-r{ratio}-s{max_staleness}-") as tmp:
        root = Path(tmp)
        write_model_config(root / "model")
        cfg = load_config(None, cell_overrides(shape, max_staleness, root))
        paths = create_run(root / "run", cfg)
        ops = BenchOps(paths, cfg)
        ops._ensure_repos()
        server = InferenceStandIn(shape, lambda: read_policy_latest(paths) or 0)
        node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), ops, OverlapPolicy(server, shape),
                           NodeOptions(node_id="bench", workers=Workers(init=shape.init_workers, run=shape.run_workers,
                                                                        eval=shape.eval_workers),
                                       scratch=root / "node"))
        trainer = StandInTrainer(paths.root, cfg, Options(instance_ids=[t.instance_id for t in load_tasks("builtin")],
                                                          idle_timeout_s=0.2))
        trainer.seconds_per_token = shape.trainer_s_per_token(ratio)
        trainer.trainer_signal = shape.trainer_signal
        trainer.setup()
        node_thread = threading.Thread(target=node.run, name="bench-rollout-node", daemon=True)
        node_thread.start()
        try:
            trainer.run()
        finally:
            node.request_drain("bench done")
            node_thread.join(timeout=60)
        trained = sorted(trainer.lead.consumer.state.trained_tasks)
        figures = cell_figures(paths.root, shape, ratio, max_staleness, server,
                               trained_tasks=trained, latest=read_policy_latest(paths))
        steps = sorted(read_metrics(paths.root, "train_step"), key=lambda r: int(r["step"]))
        episodes = list(read_metrics(paths.root, "episode"))
        engine = trainer.engine
        assert isinstance(engine, SleepEngine), "StandInTrainer builds a SleepEngine"
        figures["idle_causes"], figures["loop_s"] = idle_decomposition(
            engine.spans, trainer.wait_clock.waits, steps, episodes, trainer.issue_clock.issued, shape.warm_steps)
        return figures


def cell_figures(run: Path, shape: Shape, ratio: float, max_staleness: int, server: InferenceStandIn, *,
                 trained_tasks: list[str], latest: int | None) -> dict[str, Any]:
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: int(r["step"]))
    episodes = list(read_metrics(run, "episode"))
    w0, w1 = steps[shape.warm_steps - 1], steps[-1]
    window = steps[shape.warm_steps:]
    span = w1["t"] - w0["t"]
    trained = sum(int(r["samples"]) for r in window)
    stale_dropped = int(steps[-1]["drops"].get("stale", 0))
    # a sample the node's staleness guard cancels ends as status "cancelled" with a "stale" fault record
    stale_cancelled = sum(1 for f in read_metrics(run, "fault") if f.get("fault") == "stale")
    ok = [e for e in episodes if "run_s" in e.get("timings", {})]
    stats = stage_stats(ok)
    llm_per_sample = shape.turns * shape.llm_s_per_turn
    caps = {"init": shape.init_workers / stats["init"][2], "run": shape.run_workers / stats["run"][2],
            "eval": shape.eval_workers / stats["eval"][2], "llm": shape.llm_slots / llm_per_sample}
    rollout_cap = 3600 * min(caps.values())
    step_s = statistics.fmean(float(r["step_s"]) for r in steps)
    trainer_cap = 3600 * shape.samples_per_step / step_s
    sph = 3600 * trained / span
    bound = min(rollout_cap, trainer_cap)
    return {
        "ratio": ratio, "max_staleness": max_staleness, "samples_per_hour": round(sph, 1),
        "trainer_idle": round(trainer_idle(window, w0["t"], w1["t"]), 4),
        "inference_idle": round(server.idle_fraction(w0["t"], w1["t"]), 4),
        "waste": round((stale_dropped + stale_cancelled) / max(1, len(episodes)), 4),
        "bound_fraction": round(sph / bound, 4),
        "bound": round(bound, 1), "rollout_capacity": round(rollout_cap, 1), "trainer_capacity": round(trainer_cap, 1),
        "trainer_idle_floor": round(max(0.0, 1 - rollout_cap / trainer_cap), 4),
        "rollout_bottleneck": min(caps, key=lambda k: caps[k]),
        "measured_ratio": round(step_s / (3600 * shape.samples_per_step / rollout_cap), 3),
        "stale_dropped": stale_dropped, "stale_cancelled": stale_cancelled, "episodes": len(episodes),
        "steps": len(steps), "groups_trained": sum(int(r["groups"]) for r in steps), "trained_tasks": trained_tasks,
        "latest_version": latest, "published": [r.get("published") for r in steps],
        "versions_served": sorted(server.versions),
        "staleness_trained": dict(sum((_counter(r.get("staleness_hist")) for r in steps), _counter({}))),
        "step_s": [round(float(r["step_s"]), 4) for r in steps],
        "wait_s": [round(float(r["wait_s"]), 4) for r in steps],
        "episode_s": [round(sum(e["timings"].get(k, 0.0) for k in ("init_s", "run_s", "eval_s")), 4) for e in ok],
        "stage_s": {k: [round(float(e["timings"][f"{k}_s"]), 4) for e in ok if f"{k}_s" in e["timings"]]
                    for k in ("init", "run", "eval")},
        # EVAL of the samples that ran the tests; a sibling with the same diff waits for that run (rollout.eval_dedup)
        "eval_run_s": [round(float(e["timings"]["eval_s"]), 4) for e in ok
                       if "eval_s" in e["timings"] and not e.get("eval_shared")],
    }


IDLE_CAUSES = ("trainer", "not_issued", "claim", "init", "run_queue", "run", "eval_queue", "eval", "handoff")


def sample_phases(episode: dict[str, Any], issued: float) -> list[tuple[str, float, float]]:
    """The life of one sample as wall-clock phases, from its ``episode`` record (written when EVAL ends) and its
    timings, back to when the feeder put its task: claim (put -> the node took it), init (queued + running),
    run_queue, run, eval_queue, eval; ``not_issued`` before the put and ``handoff`` after EVAL (shard age,
    the consumer's poll, batch assembly)."""
    tm = episode["timings"]
    t = float(episode["t"])
    marks = [t]
    for key in ("eval_s", "eval_wait_s", "run_s", "run_wait_s", "init_s", "init_wait_s"):
        marks.append(marks[-1] - float(tm.get(key, 0.0)))
    eval_end, eval_start, run_end, run_start, init_end, _init_start, claimed = marks
    inf = float("inf")
    return [("not_issued", -inf, issued), ("claim", issued, claimed), ("init", claimed, init_end),
            ("run_queue", init_end, run_start), ("run", run_start, run_end), ("eval_queue", run_end, eval_start),
            ("eval", eval_start, eval_end), ("handoff", eval_end, inf)]


def idle_decomposition(spans: list[tuple[float, float]], waits: list[tuple[float, float]], steps: list[dict[str, Any]],
                       episodes: list[dict[str, Any]], issued: dict[str, float],
                       warm_steps: int) -> tuple[dict[str, float], list[float]]:
    """Where the trainer stand-in's idle time in the steady window went, as shares of the window (they sum to
    its idle share). Each gap between two steps, instant by instant: until the batch's last sample to finish
    (its critical sample) left EVAL, the phase that sample was in (:func:`sample_phases`: the data did not exist
    yet); after that, ``handoff`` while the trainer waited for a batch (``waits``: shard age, the consumer's
    poll, batch assembly) and ``trainer`` otherwise (the loop's own work: marking trained, publish, metrics, the
    feeder's top-up, planning). Also returns the ``trainer`` seconds of every gap after the first step (for
    ``sim_overlap.py``: the loop's own time between steps)."""
    by_task: dict[str, list[dict[str, Any]]] = {}
    for e in episodes:
        if e.get("status") == "ok" and "run_s" in e.get("timings", {}):
            by_task.setdefault(str(e["task_id"]), []).append(e)
    out = dict.fromkeys(IDLE_CAUSES, 0.0)
    loop_s = []
    for k in range(1, len(steps)):
        gap0, gap1 = spans[k - 1][1], spans[k][0]
        share = dict.fromkeys(IDLE_CAUSES, 0.0)
        critical = max((e for t in steps[k]["task_ids"] for e in by_task.get(t, [])), key=lambda e: float(e["t"]))
        *phases, (_, ready, _) = sample_phases(critical, issued.get(str(critical["task_id"]), float("-inf")))
        for cause, p0, p1 in phases:
            share[cause] += max(0.0, min(gap1, p1) - max(gap0, p0))
        after = max(gap0, min(ready, gap1))
        waited = sum(max(0.0, min(w1, gap1) - max(w0, after)) for w0, w1 in waits)
        share["handoff"] += waited
        share["trainer"] += gap1 - after - waited
        loop_s.append(round(share["trainer"], 4))
        if k >= warm_steps:
            out = {c: out[c] + share[c] for c in IDLE_CAUSES}
    window = spans[-1][1] - spans[warm_steps - 1][1]
    return {k: round(v / window, 4) for k, v in out.items()}, loop_s


def _counter(hist: dict[str, int] | None) -> Any:
    from collections import Counter

    return Counter({str(k): int(v) for k, v in (hist or {}).items()})


def _cell_child(shape_json: dict[str, Any], ratio: float, max_staleness: int, port: int, out: Any) -> None:
    import os

    os.environ["MASTER_PORT"] = str(port)  # the parent's pick, distinct from its running siblings' ports
    try:
        out.put(("ok", run_cell(Shape(**shape_json), ratio, max_staleness)))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which fails the bench
        import traceback

        out.put(("error", f"ratio {ratio} staleness {max_staleness}: {exc!r}\n{traceback.format_exc()}"))


def cell_estimate_s(shape: Shape, ratio: float, max_staleness: int) -> float:
    """Rough duration of a cell (to start the longest first): synchronous steps take rollout + train."""
    r = shape.rollout_step_s()
    return shape.steps * (r + ratio * r if max_staleness == 0 else max(r, ratio * r))


def _next_result(queue: Any, running: list[Any]) -> tuple[str, Any]:
    """The next cell's ("ok", figures) or ("error", why); a cell process that died without a word is an error."""
    import queue as queue_mod

    while True:
        try:
            return queue.get(timeout=5)  # type: ignore[no-any-return]
        except queue_mod.Empty:
            dead = [p for p in running if p.exitcode not in (None, 0)]
            if dead:
                return "error", f"a cell process exited with {dead[0].exitcode} without a result"


def run_cells(shape: Shape, cells: list[tuple[float, int]], parallel: int) -> list[dict[str, Any]]:
    """Every cell in its own process (torch.distributed is per process), at most ``parallel`` at a time, the
    longest first; each is printed as it ends. Returned in the order of ``cells``."""
    from train_node.trainer.dist_env import free_port

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    ports: dict[Any, int] = {}
    todo = sorted(cells, key=lambda c: -cell_estimate_s(shape, *c))
    running: list[Any] = []
    results: list[dict[str, Any]] = []
    while todo or running:
        while todo and len(running) < parallel:
            ratio, staleness = todo.pop(0)
            port = free_port()
            while port in ports.values():  # two cells picking "a free port" at once may get the same one
                port = free_port()
            proc = ctx.Process(target=_cell_child, args=(asdict(shape), ratio, staleness, port, queue))
            proc.start()
            ports[proc] = port
            running.append(proc)
        kind, msg = _next_result(queue, running)
        if kind == "error":
            for proc in running:
                proc.terminate()
            raise SystemExit("bench_overlap: a cell failed:\n" + msg)
        results.append(msg)
        print(f"  cell ratio {msg['ratio']} staleness {msg['max_staleness']}: {msg['samples_per_hour']:.0f} samples/h, "
              f"trainer idle {msg['trainer_idle']:.1%}", flush=True)
        while (done := next((p for p in running if not p.is_alive()), None)) is None:
            time.sleep(0.05)  # the cell that sent this result is exiting
        done.join()
        running.remove(done)
        ports.pop(done)
    order = {c: k for k, c in enumerate(cells)}
    return sorted(results, key=lambda c: order[(c["ratio"], c["max_staleness"])])


TABLE_KEYS = ("ratio", "max_staleness", "samples_per_hour", "trainer_idle", "inference_idle", "waste",
              "bound_fraction")


def print_table(cells: list[dict[str, Any]], title: str) -> None:
    print(f"== {title}")
    print(f"  {'ratio':>6} {'staleness':>9} {'samples/h':>10} {'trainer idle':>12} {'infer idle':>10} "
          f"{'waste':>6} {'of bound':>8} {'bound/h':>9}")
    for c in cells:
        print(f"  {c['ratio']:6.2f} {c['max_staleness']:9d} {c['samples_per_hour']:10.0f} {c['trainer_idle']:12.1%} "
              f"{c['inference_idle']:10.1%} {c['waste']:6.1%} {c['bound_fraction']:8.0%} {c['bound']:9.0f}")
    print("  trainer idle by cause (share of the window; before the batch's last sample left EVAL, the phase it was "
          "in), against the floor 1 - rollout capacity / trainer capacity:")
    for c in cells:
        causes = ", ".join(f"{k} {v:.1%}" for k, v in c["idle_causes"].items() if v >= 0.0005)
        print(f"  {c['ratio']:6.2f} {c['max_staleness']:9d}  measured ratio {c['measured_ratio']:.2f}, floor "
              f"{c['trainer_idle_floor']:.1%}: {causes}")


def targets(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Issue 35's targets at ratio 1: staleness 2 vs 0 samples/hour >= 1.8x, trainer idle and waste <= 5 %."""
    at1 = {c["max_staleness"]: c for c in cells if c["ratio"] == 1}
    if 0 not in at1 or 2 not in at1:
        return {}
    speedup = at1[2]["samples_per_hour"] / at1[0]["samples_per_hour"]
    return {"async_over_sync": round(speedup, 3), "async_trainer_idle": at1[2]["trainer_idle"],
            "async_waste": at1[2]["waste"], "async_measured_ratio": at1[2]["measured_ratio"],
            "async_trainer_idle_floor": at1[2]["trainer_idle_floor"],
            "met": speedup >= 1.8 and at1[2]["trainer_idle"] <= 0.05 and at1[2]["waste"] <= 0.05}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.25, 0.5, 1.0, 2.0, 4.0])
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2, 4])
    p.add_argument("--parallel", type=int, default=5, help="cells run side by side (each its own process)")
    p.add_argument("--json-out", type=Path, help="also write the full per-cell figures (with distributions) here")
    for name, default in asdict(Shape()).items():
        if isinstance(default, bool):
            p.add_argument(f"--{name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=default)
        else:
            p.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    args = p.parse_args(argv)
    shape = Shape(**{k: getattr(args, k) for k in asdict(Shape())})
    if shape.warm_steps < 1 or shape.steps < shape.warm_steps + 2:
        p.error("--steps must exceed --warm-steps by at least 2, and --warm-steps be >= 1")
    if args.parallel < 1 or any(s < 0 for s in args.staleness) or any(r <= 0 for r in args.ratios):
        p.error("--parallel >= 1, --staleness >= 0 and --ratios > 0")
    print(f"== bench_overlap: {shape.steps} steps of {shape.samples_per_step} samples ({shape.groups_per_step} x "
          f"{shape.group_size}), workers init={shape.init_workers} run={shape.run_workers} eval={shape.eval_workers}, "
          f"LLM stand-in {shape.llm_slots} slots, {shape.prefill_s * 1000:.3f} ms/prompt token, "
          f"{shape.decode_s * 1000:.2f} ms/generated token (time scale {shape.time_scale}), "
          f"rollout time of a step {shape.rollout_step_s():.2f} s, shard age {shape.shard_max_age_s:g} s, "
          f"trainer-waiting signal {'on' if shape.trainer_signal else 'off'}", flush=True)
    t0 = time.monotonic()
    cells = run_cells(shape, [(r, s) for r in args.ratios for s in args.staleness], args.parallel)
    print_table(cells, f"measured ({time.monotonic() - t0:.0f} s)")
    summary = targets(cells)
    if summary:
        print(f"  ratio 1: staleness 2 / synchronous = {summary['async_over_sync']:.2f}x (target >= 1.8x), trainer "
              f"idle {summary['async_trainer_idle']:.1%} (<= 5 %; at a measured ratio of "
              f"{summary['async_measured_ratio']:.2f} its floor is {summary['async_trainer_idle_floor']:.1%}), "
              f"waste {summary['async_waste']:.1%} (<= 5 %)")
    if args.json_out:
        args.json_out.write_text(json.dumps({"shape": asdict(shape), "cells": cells}, indent=1))
    print(json.dumps({"bench": "overlap", "shape": asdict(shape), "targets": summary,
                      "cells": [{k: c[k] for k in (*TABLE_KEYS, "bound", "rollout_capacity", "trainer_capacity")}
                                for c in cells]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
