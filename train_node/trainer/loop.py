"""The train loop: one table of contents of named steps, run by every rank of the train group.

Rank 0 owns everything that touches the spool (feeder, consumer, batch source), publishing and
metrics (:class:`Lead`, which no other rank has); each step it sends every rank a small control
message (train these micro-batches: that rank's part of the plan only / idle / stop) so all ranks
run the same collectives. Order of operations per optimizer step:

    feed tasks -> get batch (prefetched; a wait raises control/TRAINER_WAITING) -> plan + scatter micro-batches -> train step
    -> mark trained -> publish (every N) -> metrics -> checkpoint + spool commit (every K)

Resume (:meth:`Trainer.setup`): the newest checkpoint that matches its manifest is restored (engine
state, RNG states, trainer state: its :class:`~train_node.trainer.checkpoint.CheckpointMeta`); a torn
newer one is skipped, and after fencing the shards committed after it go back to ready
(``Spool.uncommit``) and LATEST names the restored one. The
spool is fenced (a stale predecessor can no longer commit) and ``recover`` commits the shards that
checkpoint covers and returns every other claimed shard to ready. A trainer of an older generation
writes nothing: the fence is checked (rank 0, broadcast) before every checkpoint and publish, and
again before each LATEST flip and retention pass; it then stops with FencedError. Versions published
after that checkpoint belong to discarded steps: the restored weights are published as a new version
before any step trains (servers reload them), and samples with tokens of the discarded versions are
dropped (``discarded_lineage``), never counted as fresh.

Staleness is filtered at the version that will train the batch (:meth:`Trainer.train_version`), so a
batch prefetched while a step runs is judged against the version that step publishes.

Non-finite steps (:mod:`train_node.trainer.engine`'s guard): a step none of whose updates was applied
does not count as a step: nothing is published or checkpointed, its batch is dropped (reason
``nonfinite``), and ``nonfinite_steps`` (in every ``train_step`` record, checkpointed) grows by one.
``trainer.max_nonfinite_steps`` such steps in a row stop the trainer with :class:`NonFiniteError`. With
``algorithm.minibatches`` > 1 a non-finite update after applied ones ends the step early; it is
published and counted as a non-finite step too.
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as tdist

from hpc.config import RunConfig
from hpc.metrics import MetricsWriter
from hpc.paths import RunPaths
from hpc.spool import ConsumerSpool, Spool
from train_node.trainer import checkpoint as ckpt
from train_node.trainer import signals
from train_node.trainer.checkpoint import CheckpointMeta, TrainerState
from train_node.trainer.consumer import Batch, Consumer, ConsumerState
from train_node.trainer.controls import shuffle_rewards, step_rng
from train_node.trainer.dist_env import DistEnv, resolve
from train_node.trainer.engine import Engine, NonFiniteError, StepResult, init_distributed, load_model
from train_node.trainer.faults import fault_point
from train_node.trainer.feeder import Feeder
from train_node.trainer.lead import Lead
from train_node.trainer.packing import Plan, plan_minibatches
from train_node.trainer.publish import Publisher, latest_version
from train_node.trainer.source import BatchSource, WaitSignal

CONSUMER_ID = "trainer"


@dataclass
class Options:
    """Knobs that are not part of run.yaml, for in-process use (a CLI or a test that runs the loop itself)."""

    instance_ids: list[str] | None = None  # feed these tasks (None: no feeder)
    idle_timeout_s: float = 0.5  # one wait for data before the loop re-checks stop conditions
    max_idle_s: float | None = None  # give up (exit 0) after this long without data; None = wait forever
    process_name: str = "trainer"


@dataclass
class Counters:
    started: float = field(default_factory=time.perf_counter)
    idle_s: float = 0.0
    tokens: int = 0
    last_data: float = field(default_factory=time.monotonic)
    nonfinite_in_row: int = 0


class Trainer:
    def __init__(self, run_dir: str | Path, config: RunConfig, options: Options | None = None,
                 dist: DistEnv | None = None) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.cfg = config
        self.opt = options or Options()
        self.dist = dist or resolve()
        self.stop = signals.StopFlag()
        self.step = 0
        self.counters = Counters()
        self.rank = 0
        self.world = 1
        self.exit_code = 0
        self.nonfinite_steps = 0  # steps with an update the non-finite guard skipped, over the lineage
        self._step_publishes = True  # whether the next (or running) step publishes; see train_version
        self._lead: Lead | None = None
        self.skipped: list[dict[str, str]] = []  # torn checkpoints passed over on resume
        self._parent: str | None = None  # the tag the next checkpoint names as its parent

    @property
    def lead(self) -> Lead:
        """Rank 0's state (RuntimeError on the other ranks and before :meth:`setup`)."""
        if self._lead is None:
            raise RuntimeError(f"rank {self.rank} holds no rank-0 state (rank 0 only, after setup)")
        return self._lead

    # ================================================================== setup
    def setup(self) -> None:
        init_distributed(self.dist)
        self.rank, self.world = tdist.get_rank(), tdist.get_world_size()
        meta = self._latest_meta()
        self.engine = self._build_engine(meta)
        if meta is not None:
            ckpt.load(self.engine, self.paths, meta.tag, universal=meta.needs_universal(self.world))
            self.step = meta.step
            self.nonfinite_steps = meta.trainer_state.nonfinite_steps
        if self.rank == 0:
            self._lead = self._setup_rank0(meta)
        self._publish_initial(meta)
        self._step_publishes = (self.step + 1) % self.cfg.trainer.publish_every == 0
        if self.rank == 0:  # only now: the first batch is filtered at the version just published
            self.lead.source = BatchSource(self.lead.consumer, self.cfg.algorithm.groups_per_step, self.train_version,
                                           prefetch=self.cfg.trainer.prefetch, draining=self._draining,
                                           poll_interval_s=min(0.2, self.cfg.spool.poll_interval_s))
        self.counters = Counters()  # idle time and throughput count from here, not from process start

    def _latest_meta(self) -> CheckpointMeta | None:
        """The newest checkpoint that matches its manifest (rank 0 checks; torn ones are skipped and
        remembered in ``self.skipped`` for the spool fall-back in :meth:`_setup_rank0`)."""
        box: list[Any] = [None, []]
        if self.rank == 0:
            ckpt.clean_temporaries(self.paths)
            tag, box[1] = ckpt.usable_latest(self.paths)
            if tag is not None:
                box[0] = CheckpointMeta.read(self.paths, tag)
        tdist.broadcast_object_list(box, src=0)
        meta: CheckpointMeta | None = box[0]
        self.skipped = box[1]
        self._parent = meta.tag if meta is not None else None
        return meta

    def model_dir(self) -> Path:
        return self.paths.model_dir(self.cfg.model.path)

    def tokenizer_dir(self) -> Path:
        return self.paths.tokenizer_dir(self.cfg.model.path, self.cfg.model.tokenizer_path)

    def _build_engine(self, meta: CheckpointMeta | None) -> Engine:
        t = self.cfg.trainer
        model = load_model(self.model_dir(), t.precision, t.activation_checkpointing)
        ref = None
        if self.cfg.algorithm.kl_coef > 0:
            ref = load_model(self.model_dir(), t.precision, False).requires_grad_(False)
        universal = meta is not None and meta.needs_universal(self.world)
        return Engine(model, t, self.cfg.algorithm, load_universal=universal, ref_model=ref)

    def _setup_rank0(self, meta: CheckpointMeta | None) -> Lead:
        spool: ConsumerSpool = Spool(self.paths.root, self.cfg.spool)
        generation = spool.fence(CONSUMER_ID)
        uncommitted = self._fall_back(spool, meta)
        recovered = dict(spool.recover(CONSUMER_ID, meta.shards if meta else [], checkpoint=meta.tag if meta else ""),
                         uncommitted=uncommitted)
        state = ConsumerState.from_json(meta.trainer_state.consumer) if meta else None
        consumer = Consumer(spool, CONSUMER_ID, self.cfg.algorithm, max_seq_len=self.cfg.trainer.max_seq_len,
                            state=state)
        from transformers import AutoConfig

        publisher = Publisher(self.paths, AutoConfig.from_pretrained(str(self.model_dir())),
                              self.tokenizer_dir(), keep=self.cfg.trainer.keep_policies,
                              generation=generation, fence=self._fence)
        lead = Lead(spool, generation, consumer, self._make_feeder(meta), publisher,
                    MetricsWriter(self.paths.root, f"{self.opt.process_name}-{self.rank}"),
                    WaitSignal(self.paths, generation))
        lead.metrics.log("trainer_start", step=self.step, generation=generation, recovered=recovered,
                         world_size=self.world, resumed_from=meta.tag if meta else None, skipped=self.skipped)
        return lead

    def _fence(self) -> None:
        """Rank 0: FencedError when a newer trainer generation exists (this one must not write)."""
        self.lead.spool.check_fence(CONSUMER_ID)

    def _fall_back(self, spool: ConsumerSpool, meta: CheckpointMeta | None) -> int:
        """Rank 0, after fencing: checkpoints skipped as torn leave the lineage; the shards committed
        after them go back to ready (trained again here), and LATEST names the one resumed from."""
        if not self.skipped:
            return 0
        moved = spool.uncommit(CONSUMER_ID, [s["tag"] for s in self.skipped])
        if meta is not None:
            ckpt.write_latest(self.paths, meta)
        else:
            self.paths.checkpoint_latest.unlink(missing_ok=True)
        return moved

    def train_version(self, outstanding: bool) -> int:
        """The policy version of the weights that will train the batch being built: the published
        version, plus one when a batch is already handed out (``outstanding``, its step not finished)
        and that step publishes, since the new batch trains after it."""
        return self.lead.publisher.version + int(outstanding and self._step_publishes)

    def _make_feeder(self, meta: CheckpointMeta | None) -> Feeder | None:
        if not self.opt.instance_ids:
            return None
        f = Feeder(list(self.opt.instance_ids), self.cfg.tasks.epochs, self.cfg.tasks.shuffle_seed,
                   self.cfg.algorithm.group_size, self.cfg.trainer.max_tasks_outstanding, consumer_id=CONSUMER_ID,
                   shuffle=self.cfg.tasks.order == "shuffle")
        if meta:
            f.restore(meta.trainer_state.feeder)
        return f

    def _discard_lost_versions(self, meta: CheckpointMeta | None) -> bool:
        """Rank 0, on resume: versions published after the restored checkpoint came from steps that are
        now discarded. Their samples are not this lineage's (dropped as ``discarded_lineage``), and the
        servers must serve the restored weights: returns True when those must be published now.
        Without a checkpoint the restored weights are the initial ones, version 0 (a predecessor that
        published steps but never checkpointed leaves only discarded versions behind)."""
        latest = latest_version(self.paths)
        if latest is None:
            return True
        restored = (latest if meta.policy_version is None else meta.policy_version) if meta is not None else 0
        if latest <= restored:
            return False
        self.lead.consumer.state.discarded_versions.append((restored + 1, latest))
        self.lead.metrics.log("lineage_discarded", versions=[restored + 1, latest],
                              resumed_from=meta.tag if meta is not None else None)
        return True

    def _publish_initial(self, meta: CheckpointMeta | None) -> None:
        need = torch.tensor([1 if self.rank == 0 and self._discard_lost_versions(meta) else 0])
        tdist.broadcast(need, src=0)
        if int(need.item()):
            self.publish(wait=True)

    # ================================================================== the loop
    def run(self) -> int:
        previous = signals.install(self.stop)
        try:
            while self.iterate() != "stop":
                pass
        finally:
            signals.restore(previous)
            self.close()
        return self.exit_code

    def iterate(self) -> str:
        """One decision and its action on every rank; returns the command ('train', 'idle', 'stop')."""
        msg = self._next_message()
        if msg["cmd"] == "stop":
            self._finish(msg)
        elif msg["cmd"] == "train":
            self.train_step(msg)
        return str(msg["cmd"])

    def _next_message(self) -> dict[str, Any]:
        """Rank 0 decides what every rank does next; each rank receives its own message (a train
        message carries that rank's micro-batches only)."""
        box: list[Any] = [None]
        tdist.scatter_object_list(box, self._decide() if self.rank == 0 else None, src=0)
        return dict(box[0])

    def _decide(self) -> list[dict[str, Any]]:
        """Rank 0: the next message of every rank, by rank."""
        reason = self._stop_reason()
        lead = self.lead
        if reason:
            with lead.consumer.lock:
                unsaved = lead.consumer.has_delta()
            final = unsaved or (self.step > 0 and ckpt.step_of(ckpt.latest_tag(self.paths)) != self.step)
            return [{"cmd": "stop", "reason": reason, "checkpoint": final}] * self.world
        if lead.feeder is not None:
            with lead.consumer.lock:
                lead.feeder.top_up(lead.spool, lead.consumer, lead.publisher.version)
            for event in lead.feeder.take_events():
                lead.metrics.log(event.pop("event"), step=self.step, **event)
        batch, waited = self._get_batch()
        self.counters.idle_s += waited
        if batch is None:
            return [{"cmd": "idle"}] * self.world
        self.counters.last_data = time.monotonic()
        if self.cfg.algorithm.control_shuffle_rewards:  # a bench's control arm (controls.py), never a real run
            shuffle_rewards(batch, self.cfg.algorithm.advantage_norm, step_rng(self.cfg.run.seed, self.step + 1))
        plans = plan_minibatches(batch.samples, self.cfg.algorithm.minibatches, self.world,
                                 self.cfg.trainer.micro_batch_tokens)
        lead.pending = (batch, plans, waited)
        return [{"cmd": "train", "minibatches": [p.per_rank[r] for p in plans]} for r in range(self.world)]

    def _get_batch(self) -> tuple[Batch | None, float]:
        """Rank 0: the next batch (None after ``idle_timeout_s``) and the seconds waited. A wait is signalled to
        the rollout nodes (:class:`WaitSignal`) until a batch comes."""
        lead = self.lead
        batch, waited = lead.batches.get(0.0)
        if batch is None:
            lead.waiting.begin(self.step + 1, self.train_version(False))
            batch, more = lead.batches.get(self.opt.idle_timeout_s)
            waited += more
        if batch is not None:
            lead.waiting.end()
        return batch, waited

    def _stop_reason(self) -> str:
        if self.stop.is_set():
            return f"signal:{self.stop.signal_name}"
        if self.step >= self.cfg.trainer.total_steps:
            return "total_steps"
        if self.lead.feeder is not None and self.lead.feeder.finished:
            return "dataset_done"
        if self._draining() and self._drained():
            return "drained"
        if self.opt.max_idle_s is not None and time.monotonic() - self.counters.last_data > self.opt.max_idle_s:
            return "idle_timeout"
        return ""

    def _draining(self) -> bool:
        return self.paths.stop_marker.exists()

    def _drained(self) -> bool:
        lead = self.lead
        with lead.consumer.lock:
            if lead.batches.has_ready() or lead.consumer.complete_groups() or lead.spool.pending_work():
                return False
            lead.consumer.drop_incomplete()
        return True

    # ================================================================== one step
    def train_step(self, msg: dict[str, Any]) -> StepResult:
        result = self.engine.train_step(*msg["minibatches"])
        self._count_nonfinite(result)
        if result.updates == 0:
            self._skip_step(result)
        else:
            self._finish_step(result)
        self._stop_if_nonfinite(result)
        return result

    def _finish_step(self, result: StepResult) -> None:
        self.step += 1
        self.counters.tokens += result.tokens
        published = None
        if self.rank == 0:
            with self.lead.consumer.lock:
                self.lead.consumer.mark_trained(self.lead.handed_out()[0], self.step)
        published = self._publish_and_finish_step()
        if self.rank == 0:
            self._log_step(result, *self.lead.handed_out(), published)
        if self.step % self.cfg.trainer.checkpoint_every == 0:
            self.checkpoint()

    def _count_nonfinite(self, result: StepResult) -> None:
        """Every rank (the guard's verdict is all-reduced): count a step with a skipped update."""
        if not result.nonfinite:
            self.counters.nonfinite_in_row = 0
            return
        self.nonfinite_steps += 1
        self.counters.nonfinite_in_row += 1

    def _skip_step(self, result: StepResult) -> None:
        """A step that applied nothing: its batch is dropped, nothing is published; see the module docstring."""
        if self.rank == 0:
            lead, batch = self.lead, self.lead.handed_out()[0]
            with lead.consumer.lock:
                lead.consumer.drop_batch(batch, "nonfinite")
                lead.batches.step_finished()
            lead.metrics.log("nonfinite_step", step=self.step, nonfinite=result.nonfinite,
                             nonfinite_steps=self.nonfinite_steps, in_a_row=self.counters.nonfinite_in_row,
                             samples=len(batch.samples), task_ids=batch.task_ids)

    def _stop_if_nonfinite(self, result: StepResult) -> None:
        """Every rank: ``trainer.max_nonfinite_steps`` steps in a row with a skipped update stop the trainer."""
        limit = self.cfg.trainer.max_nonfinite_steps
        if self.counters.nonfinite_in_row >= limit:
            message = (f"{self.counters.nonfinite_in_row} steps in a row had a non-finite {result.nonfinite} on some "
                       f"rank (trainer.max_nonfinite_steps = {limit}); no such update was applied or published, and "
                       f"the batches of steps that applied nothing were dropped (reason 'nonfinite'). Look for corrupt "
                       f"trajectories or a diverging policy (lower trainer.lr, check algorithm.kl_coef) and resume "
                       f"from the last checkpoint")
            if self.rank == 0:
                self.lead.metrics.log("trainer_stop", step=self.step, reason="nonfinite", exit_code=NonFiniteError.exit_code,
                                 nonfinite_steps=self.nonfinite_steps, error=message)
            raise NonFiniteError(message)

    def _publish_and_finish_step(self) -> Any:
        """Publish (every N steps) and end the step for the batch source, atomically for a prefetch
        that is filtering the next batch (it holds the consumer lock while it asks train_version)."""
        lock = self.lead.consumer.lock if self.rank == 0 else contextlib.nullcontext()
        with lock:
            published = self.publish() if self._step_publishes else None
            self._step_publishes = (self.step + 1) % self.cfg.trainer.publish_every == 0
            if self.rank == 0:
                self.lead.batches.step_finished()
        return published

    def publish(self, *, wait: bool = False) -> Any:
        """Collective (ZeRO-3 gathers); rank 0 hands the weights to the background writer."""
        t0 = time.perf_counter()
        ckpt.fence_collective(self._fence if self.rank == 0 else None)
        sd = self.engine.full_state_dict()
        if self.rank != 0:
            return None
        assert sd is not None
        stats = self.lead.publisher.publish(sd, copy_s=time.perf_counter() - t0)
        if wait:
            self.lead.publisher.wait()
        return stats

    def _log_step(self, r: StepResult, batch: Batch, plans: list[Plan], waited: float, published: Any) -> None:
        s = r.sums
        rewards = batch.rewards
        wall = time.perf_counter() - self.counters.started
        tokens, capacity = sum(p.total_tokens for p in plans), sum(p.capacity_tokens for p in plans)
        lead = self.lead
        lead.metrics.log(
            "train_step", step=self.step, loss=s.loss / max(s.tokens, 1), loss_tokens=s.tokens,
            reward_mean=sum(rewards) / len(rewards), pass_rate=sum(x >= 1.0 for x in rewards) / len(rewards),
            clip_fraction=s.clipped / max(s.tokens, 1), kl=s.kl / max(s.tokens, 1),
            ratio_dev=s.ratio_dev / max(s.tokens, 1), truncated_fraction=s.truncated / max(s.tokens, 1),
            weight_mean=s.weight / max(s.tokens, 1), by_staleness=s.by_staleness(), masked_samples=batch.masked,
            **({"grad_norm": r.grad_norm} if r.grad_norm is not None and math.isfinite(r.grad_norm) else
               {} if r.nonfinite else {"grad_norm_absent": "trainer.grad_clip is 0 at ZeRO-0: DeepSpeed computes no norm"}),
            lr=r.lr, **({"step_kl": r.step_kl} if r.step_kl is not None else {}),
            step_s=r.seconds, tokens=tokens, tokens_per_s=tokens / max(r.seconds, 1e-9),
            packing_efficiency=tokens / capacity if capacity else 0.0,
            micro_batches=sum(len(p.per_rank[0]) for p in plans), minibatches=len(plans), updates=r.updates,
            nonfinite_steps=self.nonfinite_steps, **({"nonfinite": r.nonfinite} if r.nonfinite else {}),
            groups=len(batch.groups), samples=len(batch.samples), task_ids=batch.task_ids,
            staleness_hist=dict(sorted(collections.Counter(batch.staleness).items())),
            drops=dict(lead.consumer.drops), wait_s=waited,
            idle_fraction=self.counters.idle_s / max(wall, 1e-9), policy_version=lead.publisher.version,
            published=published.version if published is not None else None,
            publish_done=vars(lead.publisher.completed) if lead.publisher.completed is not None else None,
        )

    # ================================================================== checkpoint
    def checkpoint(self) -> None:
        """Collective. Engine state + trainer state; LATEST flips; then (rank 0) the spool commit."""
        t0 = time.perf_counter()
        meta: CheckpointMeta | None = None
        ledger: list[dict[str, Any]] = []
        if self.rank == 0:
            with self.lead.consumer.lock:
                ledger, covered, state = self.lead.consumer.take_checkpoint_delta()
            meta = self._meta(covered, state)
        tag = ckpt.save(self.engine, self.paths, self.step, meta, ledger, fence=self._fence if self.rank == 0 else None)
        self._parent = tag
        if meta is not None:
            fault_point("after_checkpoint")
            committed = self.lead.spool.commit(CONSUMER_ID, meta.shards, checkpoint=tag)
            ckpt.retain(self.paths, self.cfg.trainer.keep_checkpoints, fence=self._fence)
            self.lead.metrics.log("checkpoint", step=self.step, seconds=time.perf_counter() - t0,
                                  shards=len(meta.shards), committed=committed, ledger=len(ledger))

    def _meta(self, covered: list[str], state: dict[str, Any]) -> CheckpointMeta:
        lead = self.lead
        return CheckpointMeta(
            step=self.step, policy_version=lead.publisher.version, parent=self._parent, shards=covered,
            fence_generation=lead.generation, world_size=self.world, zero_stage=self.cfg.trainer.zero_stage,
            precision=self.cfg.trainer.precision, t=time.time(),
            trainer_state=TrainerState(consumer=state, feeder=lead.feeder.to_json() if lead.feeder else {},
                                       nonfinite_steps=self.nonfinite_steps))

    def _finish(self, msg: dict[str, Any]) -> None:
        reason = msg["reason"]
        if msg["checkpoint"]:
            self.checkpoint()
        if reason.startswith("signal:"):
            self.exit_code = signals.EXIT_REQUEUE
        if self.rank == 0:
            self.lead.metrics.log("trainer_stop", step=self.step, reason=reason, exit_code=self.exit_code,
                             nonfinite_steps=self.nonfinite_steps,
                             idle_fraction=self.counters.idle_s / max(time.perf_counter() - self.counters.started, 1e-9))

    def close(self) -> None:
        if self._lead is not None:
            self._lead.close()
