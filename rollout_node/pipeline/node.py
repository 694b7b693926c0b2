"""The rollout node: a feeder that claims tasks, three worker pools joined by bounded queues
(INIT -> RUN -> EVAL), a heartbeat thread, and a control loop (timeouts, cancellation,
staleness, drain, metrics) in the calling thread.

Guarantees:
- A claimed task ends exactly one way on this node: its whole group (``group_size`` samples,
  each with a final status) is written with ``writer.add_group`` and then ``finish_task``-ed; or
  it is ``release_task``-ed back to the spool (drain, or a failed write). Nothing of a task is
  written before its whole group is done, so a node killed at any point leaves only a lease that
  expires.
- A failure of one episode follows the fault table (:mod:`rollout_node.pipeline.faults`) and
  never stops a worker thread or the node.
- Stop order: the node's record (:mod:`hpc.rollout_presence`) exists from before its first claim until
  every task it held is released or written, so inference keeps serving its drain; an episode whose
  inference fails while draining releases its task instead of ending as ``inference_error``.
- A failing node stops itself (:mod:`~rollout_node.pipeline.health`): it releases every task and
  :meth:`RolloutNode.run` returns with :attr:`RolloutNode.failed` set (the CLI exits non-zero).
- Claiming stops on drain (signal, ``STOP``), on backpressure (``spool.pending_work() >=
  spool.max_ready_shards``), when the job's remaining time is below the p95 group time plus
  ``rollout.time_limit_margin_s``, and after ``max_episodes`` samples.
- Live sandboxes never exceed ``run + eval`` workers; queued episodes hold no sandbox.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc import rollout_presence
from hpc.config import RunConfig
from hpc.paths import RunPaths
from hpc.records import TaskRecord
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import TaskOps
from rollout_node.pipeline.claimgate import ClaimGate
from rollout_node.pipeline.control import ControlFiles, JobClock
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.faults import OUTCOMES, Fault
from rollout_node.pipeline.health import InfraStreak
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.policy import Policy
from rollout_node.pipeline.scratch import remove_dead_scratch, remove_tree
from rollout_node.pipeline.seeds import episode_seed
from rollout_node.pipeline.sink import GroupSink
from rollout_node.pipeline.sizing import Workers
from rollout_node.pipeline.stages import Stages, remove_workdir
from rollout_node.pipeline.staleness import StalenessGuard

log = logging.getLogger("spoolrl.rollout")
TICK_S = 0.2
ABORT_GRACE_S = 5.0  # after run_timeout_s the policy had this long to stop by itself


@dataclass
class NodeOptions:
    node_id: str
    workers: Workers
    scratch: Path
    max_episodes: int | None = None
    once: bool = False


class RolloutNode:
    """One rollout node process (see the module docstring)."""

    def __init__(self, paths: RunPaths, config: RunConfig, spool: Any, ops: TaskOps, policy: Policy,
                 options: NodeOptions, job_clock: JobClock | None = None) -> None:
        self.paths, self.config, self.spool, self.ops, self.opts = paths, config, spool, ops, options
        self.rollout = config.rollout
        self.worker_id = f"{options.node_id}.{os.getpid()}.{secrets.token_hex(2)}"
        self.scratch = options.scratch / self.worker_id
        self.control = ControlFiles(paths, config.spool.poll_interval_s)
        self.clock = job_clock or JobClock()
        self.metrics = NodeMetrics(paths.root, options.node_id)
        self.policy = policy
        self.stages = Stages(config, ops, policy, self.scratch, lambda: self.control.latest_version)
        self.staleness = StalenessGuard(config.algorithm.max_staleness, lambda: self.control.latest_version,
                                        lambda: self.metrics.stage_percentiles()["eval"]["p95"])
        size = self.rollout.queue_size
        self.queues: dict[str, queue.Queue[Episode]] = {s: queue.Queue(maxsize=size) for s in ("init", "run", "eval")}
        self.lock = threading.RLock()
        self.write_lock = threading.Lock()
        self.spool_lock = threading.Lock()  # one Spool object, used from several threads
        self.groups: dict[str, Group] = {}
        self.retries: collections.deque[Episode] = collections.deque()
        self.live: set[Episode] = set()
        self.stopping = threading.Event()
        self.draining: str | None = None
        self.streak = InfraStreak(self.rollout.max_consecutive_infra_faults)
        self.failed = ""  # why the node stopped itself (see health.py); '' while healthy
        self.drain_deadline = float("inf")
        self.claiming = False
        self.spool_dry = False
        self.claimed_samples = 0
        self.not_claiming = ""
        self.gate = ClaimGate(config, lambda: int(self._spool_call(self.spool.pending_work)), policy, self.clock,
                              self.metrics)
        self._threads: list[threading.Thread] = []
        self.sink: GroupSink | None = None

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> dict[str, Any]:
        """Run until an exit condition holds (see :mod:`hpc.cli.rollout`); returns the final metrics snapshot."""
        remove_dead_scratch(self.opts.scratch, self.opts.node_id)
        self.scratch.mkdir(parents=True, exist_ok=True)
        rollout_presence.announce(self.paths, self.worker_id, os.getpid())
        self.sink = GroupSink(self.spool, self.worker_id, self._spool_call)
        log.info("rollout node %s: workers init=%d run=%d eval=%d, scratch %s", self.worker_id,
                 self.opts.workers.init, self.opts.workers.run, self.opts.workers.eval, self.scratch)
        self._start_threads()
        next_metrics = time.monotonic() + self.rollout.metrics_interval_s
        try:
            while not self._finished():
                self._tick()
                if time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + self.rollout.metrics_interval_s
                    self.metrics.log_node(**self._gauges())
                time.sleep(TICK_S)
        finally:
            self._shutdown()
        return self.metrics.log_node(**self._gauges())

    def request_drain(self, reason: str) -> None:
        """Stop claiming; in-flight groups may finish until the drain deadline, then are released."""
        if self.draining:
            return
        budget = self.rollout.drain_timeout_s
        remaining = self.clock.remaining_s()
        if remaining is not None:
            budget = min(budget, max(0.0, remaining - 5.0))  # release before Slurm's kill
        self.draining, self.drain_deadline = reason, time.monotonic() + budget
        log.info("draining (%s): no new claims; in-flight groups have %.0f s", reason, budget)

    def _start_threads(self) -> None:
        w = self.opts.workers
        specs: list[tuple[str, Callable[[], None]]] = [("feeder", self._feeder), ("heartbeat", self._heartbeat)]
        specs += [(f"init-{i}", lambda: self._worker("init", self._do_init)) for i in range(w.init)]
        specs += [(f"run-{i}", lambda: self._worker("run", self._do_run)) for i in range(w.run)]
        specs += [(f"eval-{i}", lambda: self._worker("eval", self._do_eval)) for i in range(w.eval)]
        for name, target in specs:
            t = threading.Thread(target=target, name=f"rollout-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _shutdown(self) -> None:
        self.stopping.set()
        for t in self._threads:
            t.join(timeout=max(1.0, ABORT_GRACE_S))
        with self.lock:
            leftover = list(self.groups.values())
        for group in leftover:
            self._release_group(group, "shutdown")
        if self.sink is not None:
            with self.write_lock:
                self.sink.close()
        rollout_presence.withdraw(self.paths, self.worker_id)  # nothing held any more: inference may stop
        remove_tree(self.scratch)
        log.info("rollout node %s stopped: %s", self.worker_id, self.metrics.snapshot())

    def _finished(self) -> bool:
        with self.lock:
            busy = bool(self.groups or self.retries or self.claiming or (self.sink and self.sink.awaiting))
        if busy:
            return False
        if self.draining:
            return True
        if self.opts.max_episodes is not None and self.claimed_samples >= self.opts.max_episodes:
            return True
        return self.opts.once and self.spool_dry and self._spool_idle()

    def _spool_idle(self) -> bool:
        """--once: nothing ready and nothing claimed by anyone (expired leases come back first)."""
        try:
            stats = self._spool_call(self.spool.stats)
        except Exception:  # noqa: BLE001 - stats are advisory
            return True
        return not any(int(stats.get(k, 0) or 0) for k in ("tasks_ready", "tasks_claimed"))

    # ------------------------------------------------------------------ control loop
    def _tick(self) -> None:
        self.control.refresh()
        if self.control.stop:
            self.request_drain("STOP marker")
        with self.lock:
            groups = list(self.groups.values())
            live = list(self.live)
        for group in groups:
            if not group.closed and self.control.cancelled(group.task_id):
                self._cancel_group(group)
        for ep in live:
            self._check_episode(ep)
        if self.draining:
            self._drain_step(groups)
        if self.sink is not None:
            with self.write_lock:
                self.sink.finish_published()
        self._flush_idle()

    def _check_episode(self, ep: Episode) -> None:
        spent = ep.charged_s()
        if ep.stage == "run" and spent > self.rollout.run_timeout_s:
            ep.abort("timeout", hard=spent > self.rollout.run_timeout_s + ABORT_GRACE_S)
        if ep.stage == "run" and self.staleness.too_stale(ep.transcript.min_version()):
            ep.abort("stale")

    def _drain_step(self, groups: list[Group]) -> None:
        late = time.monotonic() >= self.drain_deadline
        for group in groups:
            if late or not group.started:
                self._release_group(group, f"drain ({self.draining})")

    def _gauges(self) -> dict[str, Any]:
        with self.lock:
            stages = collections.Counter(ep.stage for ep in self.live)
            groups = len(self.groups)
        return {"node": self.opts.node_id, "worker_id": self.worker_id, "groups_in_flight": groups,
                "queue_depth": {s: q.qsize() for s, q in self.queues.items()},
                "busy": {s: stages.get(s, 0) for s in ("init", "run", "eval")},
                "claimed_samples": self.claimed_samples, "draining": self.draining or "",
                "not_claiming": self.not_claiming, "policy_version": self.control.latest_version}

    # ------------------------------------------------------------------ feeder (claims)
    def _feeder(self) -> None:
        backlog: list[Group] = []
        while not self.stopping.is_set():
            try:
                if not self._feed_once(backlog):
                    self.stopping.wait(self.config.spool.poll_interval_s)
            except Exception:  # noqa: BLE001 - a spool hiccup must not kill the feeder
                log.exception("feeder: claiming failed; retrying")
                self.metrics.failure("claim_error")
                self.stopping.wait(self.config.spool.poll_interval_s)
        for group in backlog:
            self._release_group(group, "shutdown")

    def _feed_once(self, backlog: list[Group]) -> bool:
        with self.lock:
            retry = self.retries.popleft() if self.retries else None
        if retry is not None:
            self._put("init", retry)
            return True
        if self.draining:
            while backlog:
                self._release_group(backlog.pop(), f"drain ({self.draining})")
            return False
        while len(backlog) < self.rollout.claim_lookahead and self._may_claim():
            group = self._claim()
            if group is None:
                break
            backlog.append(group)
        if not backlog:
            return False
        group = next((g for g in backlog if self.ops.image_cached(g.image)), backlog[0])
        backlog.remove(group)
        for i in range(group.size):
            if group.closed:
                break
            self._put("init", Episode(group, i, 0, self._seed(group, i, 0)))
        return True

    def _may_claim(self) -> bool:
        self.not_claiming = self.gate.reason(self.claimed_samples, self.opts.max_episodes)
        return not self.not_claiming and not self.draining

    def _claim(self) -> Group | None:
        with self.lock:
            self.claiming = True
        try:
            lease = self._spool_call(self.spool.claim_task, self.worker_id)
            group = self._group_of(lease) if lease is not None else None
            self.spool_dry = lease is None
            return group
        finally:
            with self.lock:
                self.claiming = False

    def _group_of(self, lease: Any) -> Group | None:
        task_dict = dict(lease.task)
        size = self.config.algorithm.group_size
        try:
            size = TaskRecord.from_json(task_dict).group_size or size
            task = self.ops.parse(task_dict)
        except Exception as exc:  # noqa: BLE001 - a malformed task is accounted for, not fatal
            task = None
            error = f"malformed task: {exc}"
        group = Group(lease=lease, task_id=str(lease.task_id), task=task, task_dict=task_dict, size=size,
                      image=self.ops.image(task) if task is not None else "")
        with self.lock:
            self.groups[group.task_id] = group
            self.claimed_samples += size
        if task is None:
            self._close_with(group, Status.NODE_ERROR, error)
            return None
        self.control.refresh()
        if self.control.cancelled(group.task_id):
            self._cancel_group(group)
            return None
        return group

    def _seed(self, group: Group, sample_index: int, attempt: int) -> int:
        return episode_seed(self.config.run.seed, group.task_id, sample_index, attempt)

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat(self) -> None:
        while True:
            try:
                self._spool_call(self.spool.heartbeat, self.worker_id)
            except Exception:  # noqa: BLE001 - one missed beat is survivable; the lease is long
                log.exception("heartbeat failed")
            if self.stopping.wait(self.config.spool.heartbeat_interval_s):
                return

    # ------------------------------------------------------------------ stage workers
    def _put(self, stage: str, ep: Episode) -> None:
        while not self.stopping.is_set():
            try:
                self.queues[stage].put(ep, timeout=TICK_S)
                return
            except queue.Full:
                continue

    def _worker(self, stage: str, body: Callable[[Episode], None]) -> None:
        q = self.queues[stage]
        while not self.stopping.is_set():
            try:
                ep = q.get(timeout=TICK_S)
            except queue.Empty:
                continue
            if ep.group.closed:  # written or released meanwhile; an open group never loses an episode
                self._discard(ep)
                continue
            try:
                body(ep)
            except Exception as exc:  # noqa: BLE001 - a bug on one episode must not kill the worker
                log.exception("%s worker: unexpected error on %s", stage, ep.key)
                remove_workdir(ep)
                self._fault(ep, Fault.PIPELINE_BUG, f"{type(exc).__name__}: {exc}")

    def _do_init(self, ep: Episode) -> None:
        ep.group.started = True
        ep.enter("init")
        with self.lock:
            self.live.add(ep)
        result = self.stages.init(ep)
        self.metrics.stage_done("init", ep.leave("run_queue"))
        if result.fault is not None:
            self._fault(ep, result.fault, result.error)
        else:
            self._put("run", ep)

    def _do_run(self, ep: Episode) -> None:
        ep.enter("run")
        result = self.stages.run(ep)
        self.metrics.stage_done("run", ep.leave("eval_queue"))
        if result.fault is None and self.staleness.too_stale(ep.transcript.min_version()):
            result.fault, result.error = Fault.STALE, "too stale after RUN"
        if result.fault is not None:
            self._fault(ep, result.fault, result.error)
        else:
            self._put("eval", ep)

    def _do_eval(self, ep: Episode) -> None:
        ep.enter("eval")
        outcome = self.stages.evaluate(ep, lambda: not ep.group.closed)
        self.metrics.stage_done("eval", ep.leave("done"))
        if outcome.status.infrastructure:
            ep.metrics["error"] = str(outcome.details.get("error", outcome.status.value))
            self._record_fault(ep, Fault.HARNESS_ERROR, "eval", ep.metrics["error"],
                               eval_tries=ep.metrics.get("eval_tries", 1))
            if not self._node_failing(ep, Fault.HARNESS_ERROR, ep.metrics["error"]):
                self._complete(ep, outcome.status, None)
            return
        ep.metrics.update({k: v for k, v in outcome.details.items() if isinstance(v, (int, float, str, bool))})
        status = ep.output.status if ep.output is not None else Status.OK
        self._complete(ep, status, outcome.reward)

    # ------------------------------------------------------------------ outcomes
    def _discard(self, ep: Episode) -> None:
        remove_workdir(ep)
        with self.lock:
            self.live.discard(ep)

    def _fault(self, ep: Episode, fault: Fault, error: str) -> None:
        if ep.group.closed:  # released or cancelled as a whole: already accounted for there
            self._discard(ep)
            return
        if self.draining and fault is Fault.INFERENCE_ERROR:  # the servers are stopping: not the task's fault
            self._release_group(ep.group, f"inference failed while draining ({error[-200:]})")
            self._discard(ep)
            return
        outcome = OUTCOMES[fault]
        ep.metrics["error"] = error
        log.info("%s: %s (%s)", ep.key, fault.value, error)
        self._record_fault(ep, fault, ep.last_stage, error[-2000:])
        if self._node_failing(ep, fault, error):
            return
        if outcome.retry_from == "init" and ep.attempt < self.rollout.max_retries and not ep.group.closed:
            nxt = Episode(ep.group, ep.sample_index, ep.attempt + 1,
                          self._seed(ep.group, ep.sample_index, ep.attempt + 1))
            nxt.metrics["previous_errors"] = [*ep.metrics.get("previous_errors", []), error]
            self._discard(ep)
            with self.lock:
                self.retries.append(nxt)
            return
        self._complete(ep, outcome.status, None)

    def _record_fault(self, ep: Episode, fault: Fault, stage: str, error: str, **extra: Any) -> None:
        self.metrics.failure(fault.value)
        self.metrics.fault({"task_id": ep.group.task_id, "sample_index": ep.sample_index, "attempt": ep.attempt,
                            "fault": fault.value, "stage": stage, "error": error, **extra})

    def _node_failing(self, ep: Episode, fault: Fault, error: str) -> bool:
        """Count an infrastructure fault; at the limit the node stops claiming and releases every task now
        (this episode's first): a failing node finishes nothing more."""
        if reason := self.streak.fault(fault, error):
            self.failed = reason
            log.error("rollout node %s stops itself: %s", self.worker_id, reason)
            self.request_drain("failing")
            self.drain_deadline = time.monotonic()
        if not self.failed:
            return False
        self._release_group(ep.group, f"node failing: {self.failed}")
        self._discard(ep)
        return True

    def _complete(self, ep: Episode, status: Status, reward: float | None) -> None:
        self.streak.outcome(status)
        traj = ep.trajectory(status, reward)
        self.metrics.episode({"task_id": traj.task_id, "sample_index": traj.sample_index, "attempt": ep.attempt,
                              "status": traj.status.value, "reward": traj.reward, "timings": traj.timings,
                              "tokens": traj.num_tokens, "generated_tokens": traj.num_generated,
                              "error": ep.metrics.get("error", "")})
        with self.lock:
            self.live.discard(ep)
            group = ep.group
            if group.closed:
                return
            group.results[ep.sample_index] = traj
            done = group.complete
        if done:
            self._write_group(group)

    def _write_group(self, group: Group) -> None:
        with self.write_lock:
            if group.closed:
                return
            group.closed = True
            assert self.sink is not None, "groups are written only while the node runs"
            if not self.sink.write(group, [group.results[i] for i in range(group.size)]):
                self.metrics.failure("write_error")  # e.g. disk full: the task goes back, the node goes on
                self._release_locked(group)
                return
        with self.lock:
            self.groups.pop(group.task_id, None)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=False)

    def _flush_idle(self) -> None:
        """Nothing in flight: publish the open shard now instead of waiting for its age limit."""
        with self.lock:
            idle = not self.groups
        if not (idle and self.sink is not None and self.sink.awaiting):
            return
        with self.write_lock:
            self.sink.flush()

    def _spool_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self.spool_lock:
            return fn(*args)

    def _close_with(self, group: Group, status: Status, error: str) -> None:
        """Write every sample not yet finished with ``status`` (cancelled task, malformed task)."""
        with self.lock:
            live = [ep for ep in self.live if ep.group is group]
            missing = [i for i in range(group.size) if i not in group.results]
        for ep in live:
            ep.abort("cancelled")
        for i in missing:
            ep = Episode(group, i, 0, self._seed(group, i, 0))
            ep.metrics["error"] = error
            group.results[i] = ep.trajectory(status, None)
        self._write_group(group)

    def _cancel_group(self, group: Group) -> None:
        log.info("task %s cancelled (control/cancel)", group.task_id)
        self.metrics.failure(Fault.TASK_CANCELLED.value)
        self._close_with(group, Status.CANCELLED, "task cancelled")

    def _release_group(self, group: Group, why: str) -> None:
        with self.write_lock:
            if group.closed:
                return
            self._release_locked(group)
        log.info("released %s back to the spool: %s", group.task_id, why)

    def _release_locked(self, group: Group) -> None:
        group.closed = True
        with self.lock:
            live = [ep for ep in self.live if ep.group is group]
            self.groups.pop(group.task_id, None)
        for ep in live:
            ep.abort("drain")
        try:
            self._spool_call(self.spool.release_task, group.lease)
        except Exception:  # noqa: BLE001 - the lease then expires and the spool reclaims the task
            log.exception("releasing %s failed; its lease will expire", group.task_id)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=True)

