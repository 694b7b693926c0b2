"""The work of the three stages on one episode: INIT (work dir at base commit), RUN (the agent in
a sandbox), EVAL (tests -> reward). The thread pools, queues and bookkeeping live in
:mod:`rollout_node.pipeline.node` (workers in :mod:`~rollout_node.pipeline.workers`); this module only
decides what one episode's stage produced.

Guarantees: a stage never raises for an episode's failure: it returns a :class:`Fault` (the row
of the fault table) or None; the sandbox of a RUN is closed and its work dir removed whatever
happens; stage time is measured inside the stage (``Episode.enter``/``leave``).

Agent-caused faults (issue 13) never become infrastructure faults: a work tree the harness cannot
diff because of its own state (:class:`~rollout_node.tasks.repos.UnscorableTree`), and a sandbox
that died while the tree holds what the agent made of it (:func:`~rollout_node.tasks.repos.tree_problems`),
end the episode with its own status and ``metrics["unscorable"]`` naming why; EVAL then does not run
and the reward is 0 (``eval_status`` ``unscorable``). Nothing of it is retried.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hpc.config import RunConfig
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import EvalOutcome, TaskOps
from rollout_node.pipeline.episode import Episode
from rollout_node.pipeline.faults import Fault, classify_run_error
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, EpisodeSandbox, Policy
from rollout_node.pipeline.scratch import remove_tree
from rollout_node.tasks.repos import UnscorableTree, tree_problems

_STATUS_FAULTS = {Status.SANDBOX_ERROR: Fault.SANDBOX_CRASH, Status.INFERENCE_ERROR: Fault.INFERENCE_ERROR,
                  Status.NODE_ERROR: Fault.PIPELINE_BUG, Status.HARNESS_ERROR: Fault.PIPELINE_BUG}
DIFF_SHOWN_CHARS = 8192  # of the diff kept in the trajectory's metrics (a shard row stays small)
_ABORT_FAULTS = {"stale": Fault.STALE, "cancelled": Fault.TASK_CANCELLED, "drain": Fault.TASK_CANCELLED}


@dataclass
class StageResult:
    fault: Fault | None = None
    error: str = ""


def remove_workdir(ep: Episode) -> None:
    """Remove the work dir, also where the agent took its owner's permissions away (chmod 000)."""
    if ep.workdir is not None:
        remove_tree(ep.workdir)


class Stages:
    """Stage bodies bound to one node's config, task ops, policy and scratch directory."""

    def __init__(self, config: RunConfig, ops: TaskOps, policy: Policy, scratch: Path,
                 policy_version: Callable[[], int], draining: Callable[[], bool] = lambda: False) -> None:
        self.config = config
        self.rollout = config.rollout
        self.ops = ops
        self.policy = policy
        self.scratch = scratch
        self.policy_version = policy_version
        self.draining = draining

    def init(self, ep: Episode) -> StageResult:
        """Stage the image on the node, prepare the repository at base commit in a fresh work dir."""
        ep.workdir = self.scratch / "work" / ep.key
        shutil.rmtree(ep.workdir, ignore_errors=True)
        try:
            self.ops.stage_image(ep.group.image)
            # the checkout is cut at the stage's limit (a hung git on a stalled filesystem is killed)
            self.ops.prepare(ep.group.task, ep.workdir, max(0.0, self.rollout.init_timeout_s - ep.in_stage_s()))
        except Exception as exc:  # noqa: BLE001 - any failure to prepare is an INIT failure
            remove_workdir(ep)
            return StageResult(Fault.INIT_FAILURE, f"{type(exc).__name__}: {exc}")
        if ep.in_stage_s() > self.rollout.init_timeout_s:
            remove_workdir(ep)
            return StageResult(Fault.INIT_FAILURE, f"INIT took longer than init_timeout_s={self.rollout.init_timeout_s}")
        return StageResult()

    def run(self, ep: Episode) -> StageResult:
        """The agent episode in a sandbox on the work dir, then the diff; the work dir is removed."""
        assert ep.workdir is not None, "RUN needs the work dir INIT prepared"
        error: BaseException | None = None
        try:
            with self.ops.open_sandbox(ep.workdir, ep.group.image) as sandbox:
                ep.ctx = self._context(ep, sandbox)
                if ep.abort_reason is None:
                    ep.output = self.policy.run_episode(ep.ctx)
        except Exception as exc:  # noqa: BLE001 - classified below; never escapes the stage
            error = exc
        result = self._run_result(ep, error)
        if result.fault is None:
            result = self._collect_diff(ep)
        remove_workdir(ep)
        return result

    def _context(self, ep: Episode, sandbox: EpisodeSandbox) -> EpisodeContext:
        return EpisodeContext(
            task=ep.group.task, claim=ep.group.claim, task_id=ep.group.task_id, sandbox=sandbox,
            workdir=ep.workdir or Path("."), seed=ep.seed, sample_index=ep.sample_index, attempt=ep.attempt,
            deadline=ep.stage_t0 + self.rollout.run_timeout_s,
            command_timeout_s=self.config.sandbox.command_timeout_s, policy_version=self.policy_version,
            transcript=ep.transcript, draining=self.draining,
        )

    def _run_result(self, ep: Episode, error: BaseException | None) -> StageResult:
        reason = ep.abort_reason
        if reason == "timeout" or (reason is None and ep.charged_s() > self.rollout.run_timeout_s):
            ep.output = _timed_out(ep.output)
            return StageResult()
        if reason is not None:
            return StageResult(_ABORT_FAULTS.get(reason, Fault.TASK_CANCELLED), f"aborted: {reason}")
        fault: Fault | None
        if error is not None:
            fault, why = classify_run_error(error), f"{type(error).__name__}: {error}"
        else:
            assert ep.output is not None, "a policy returns an EpisodeOutput or raises"
            fault = _STATUS_FAULTS.get(ep.output.status)
            why = str(ep.output.metrics.get("error", ep.output.status.value))
        if fault == Fault.SANDBOX_CRASH and self._agent_broke_it(ep, why):
            return StageResult()
        if fault is not None:
            return StageResult(fault, why)
        assert ep.output is not None
        if ep.output.status == Status.CANCELLED:
            return StageResult(Fault.TASK_CANCELLED, "the policy cancelled the episode")
        return StageResult()

    def _agent_broke_it(self, ep: Episode, why: str) -> bool:
        """A sandbox that died while the tree holds undiffable entries the agent made, or past the episode's
        disk budget (``Sandbox.disk_verdict``): its outcome."""
        over = ep.ctx.sandbox.disk_verdict if ep.ctx is not None else ""
        problems = [over] if over else tree_problems(ep.workdir) if ep.workdir is not None else []
        if not problems:
            return False
        ep.metrics["unscorable"] = f"the sandbox failed ({why[:300]}) on a tree the agent broke: {'; '.join(problems)}"
        out = ep.output
        ep.output = EpisodeOutput(status=Status.OK, metrics=out.metrics if out else {},
                                  sampling=out.sampling if out else {}, logprob_kind=out.logprob_kind if out else "unknown")
        return True

    def _collect_diff(self, ep: Episode) -> StageResult:
        assert ep.workdir is not None
        try:
            ep.diff = self.ops.collect_diff(ep.group.task, ep.workdir)
        except UnscorableTree as exc:  # the tree's own state: the agent's outcome, reward 0, no retry
            ep.diff = ""
            ep.metrics.setdefault("unscorable", str(exc)[:2000])
            return StageResult()
        except Exception as exc:  # noqa: BLE001 - otherwise a work dir we cannot diff is an infrastructure fault
            return StageResult(Fault.SANDBOX_CRASH, f"collecting the diff failed: {type(exc).__name__}: {exc}")
        ep.metrics["diff_bytes"] = len(ep.diff)
        # for people (the report, spool inspect): the head of the diff; EVAL uses ep.diff itself
        ep.metrics["diff"] = ep.diff[:DIFF_SHOWN_CHARS] + ("\n[... diff cut]" if len(ep.diff) > DIFF_SHOWN_CHARS else "")
        return StageResult()

    def evaluate(self, ep: Episode, may_retry: Callable[[], bool]) -> EvalOutcome:
        """Tests -> reward; a harness failure is retried (same diff) while ``may_retry()`` allows.
        An unscorable episode (see the module docstring) is not evaluated: reward 0."""
        if ep.metrics.get("unscorable"):
            ep.metrics["eval_tries"] = 0
            return EvalOutcome(0.0, Status.OK, {"eval_status": "unscorable"})
        tries = 0
        while True:
            t0 = time.monotonic()
            outcome = self._evaluate_once(ep)
            if outcome.status.infrastructure and time.monotonic() - t0 > self.rollout.eval_timeout_s:
                outcome = EvalOutcome(None, Status.HARNESS_ERROR, {**outcome.details, "error": "eval timeout"})
            if not outcome.status.infrastructure or tries >= self.rollout.max_retries or not may_retry():
                ep.metrics["eval_tries"] = tries + 1
                return outcome
            tries += 1

    def _evaluate_once(self, ep: Episode) -> EvalOutcome:
        if self.rollout.eval_dedup:
            outcome, shared = ep.group.evals.evaluate(ep.diff, lambda: self._run_eval(ep))
        else:
            outcome, shared = self._run_eval(ep), False
        if not shared:
            return EvalOutcome(outcome.reward, outcome.status, {**outcome.details, "eval_shared": False})
        # the tests ran once for this diff in this group (rollout_node.pipeline.evalshare); none ran for this sample
        return EvalOutcome(outcome.reward, outcome.status, {**outcome.details, "eval_shared": True, "eval_s": 0.0})

    def _run_eval(self, ep: Episode) -> EvalOutcome:
        scratch = self.scratch / "eval"
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            return self.ops.evaluate(ep.group.task, ep.diff, scratch, self.rollout.eval_timeout_s)
        except Exception as exc:  # noqa: BLE001 - the harness itself broke: infrastructure
            return EvalOutcome(None, Status.HARNESS_ERROR, {"error": f"{type(exc).__name__}: {exc}"})


def _timed_out(out: EpisodeOutput | None) -> EpisodeOutput:
    if out is None:
        return EpisodeOutput(status=Status.TIMEOUT)
    return EpisodeOutput(status=Status.TIMEOUT, metrics=out.metrics, sampling=out.sampling,
                         logprob_kind=out.logprob_kind)
