"""The fault outcome table of the rollout pipeline: what each failure of one episode becomes.

Guarantees: every failure of one episode ends as a status on that sample's trajectory (or, for a
drain, as the task going back to the spool); retries are bounded by ``rollout.max_retries``;
infrastructure failures are excluded from the loss (``reward`` stays ``None``, never 0); none of
them stops the node. ``docs/faults.md`` renders the same table (a test keeps the two in sync).

============================  =====================================  ==========================  ===============
fault                         retries                                final status                in the loss?
============================  =====================================  ==========================  ===============
sandbox crash                 max_retries; sample restarts at INIT   sandbox_error               excluded
INIT failure                  max_retries; sample restarts at INIT   sandbox_error               excluded
tool hang                     none: the command is interrupted and   ok / truncated              trainable
                              the agent sees ``timed_out``
episode past run_timeout_s    none; the diff so far is evaluated     timeout                     trainable
harness error                 max_retries; EVAL only, same diff      harness_error               excluded
inference error               max_retries; sample restarts at INIT   inference_error             excluded
stale episode                 max_retries; sample restarts at INIT   cancelled                   excluded
task cancelled                none                                   cancelled                   excluded
pipeline bug (exception)      max_retries; sample restarts at INIT   node_error                  excluded
drain (signal / STOP)         none; in flight at the deadline        task released to the spool  (no trajectory)
node restart (SIGKILL)        the lease expires, any node reclaims   as the rerun ends           as the rerun
undiffable work tree          none; not evaluated: reward 0,         ok                          trainable
                              metrics ``unscorable``
sandbox fails on broken tree  none; not evaluated: reward 0,         ok                          trainable
                              metrics ``unscorable``
agent kills shell / server    none: restarted, the agent is told     ok / truncated              trainable
control files tampered        none: the python tool is off, each     ok / truncated              trainable
                              call says so
bad tool call / forged mark   none: an error observation; a forged   ok / truncated              trainable
                              marker is output
============================  =====================================  ==========================  ===============

Details:
- *sandbox crash*: ``open_sandbox`` fails or the sandbox dies under the agent
  (:class:`~hpc.errors.SandboxError`) while the work tree holds nothing the agent made undiffable
  (else it is the *sandbox fails on broken tree* row). *INIT failure*: the image or the repository at base commit
  cannot be prepared, or INIT ran past ``init_timeout_s`` (a hung checkout is killed at that limit).
- *tool hang*: one command past ``sandbox.command_timeout_s`` is a tool result, not a fault
  (STYLE.md 9). Only the whole episode running past ``run_timeout_s`` (time inside RUN, not queued,
  not waiting for the inference server) is the agent's timeout; it is trainable, scored on the diff
  it left, and ``algorithm.timeout`` decides whether its tokens enter the loss.
- *harness error*: ``evaluate`` reports ``harness_error``, raises, or runs past ``eval_timeout_s``.
  The agent's diff is kept, so a retry reruns the tests only.
- *stale episode*: the oldest generated token is more than ``algorithm.max_staleness`` versions
  behind ``RUN/policy/LATEST`` plus the whole versions expected during EVAL (``hpc.trajectory.staleness``,
  ``rollout_node.pipeline.staleness``); a restart samples the newer policy.
- *task cancelled*: a file ``RUN/control/cancel/<task_id>`` exists; the group is written with
  status ``cancelled`` so that the task is accounted for, and its sandboxes are closed.
- *drain*: SIGUSR1 (Slurm's warning), SIGTERM, SIGINT or ``RUN/control/STOP``: no new claims;
  groups still in flight ``drain_timeout_s`` later are cancelled and ``release_task``-ed. After a
  SIGTERM (Slurm signals the whole step, the sandboxes first) every group in flight is released at
  once and nothing more is written (``outcomes.STEP_SIGNALS``).
- Agent-caused faults (issue 13) are the agent's outcome, never retried: whatever stems from the work
  tree's state or a tool call's content. *undiffable work tree*: ``collect_diff`` fails and the tree
  holds FIFOs/sockets/devices, entries without owner read/search permission or nested repositories,
  or the harness diffs a pristine checkout of ``base_commit`` fine (so the tree is the cause)
  (:class:`~rollout_node.tasks.repos.UnscorableTree`); if a pristine checkout fails too (mirror,
  node disk) it is a *sandbox crash*. *sandbox fails on broken tree*: a RUN sandbox fault while
  :func:`~rollout_node.tasks.repos.tree_problems` finds such entries. *agent kills shell / server*:
  ``kill -9 $$``, ``exit``, ``kill -9 -1``, the python server killed or patched to answer garbage
  (its reply is coerced or it counts as dead). *control files tampered*: ``/work/.spoolrl`` removed
  or made inaccessible. *bad tool call / forged mark*: NaN/Infinity, huge or negative numbers, deep
  nesting, broken JSON (``parse_tool_call`` returns a ParseError the loop shows); a completion marker
  printed by the agent ends that call early (later results lag; its own problem) and one with a
  status over 3 digits is plain output. An agent therefore cannot turn failing tests into a re-roll:
  every way it has to break RUN ends trainable with reward 0. Faults outside its reach stay
  infrastructure: node disk, image, inference server, harness bugs.
- *node restart*: nothing is written for a task before its whole group is done, so a killed node
  leaves only an expired lease; the spool hands the task out again and deduplication by task id
  absorbs the rare second group of a task whose first group was written just before the kill.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hpc.errors import InferenceError, SandboxError
from hpc.trajectory import Status


class Fault(str, enum.Enum):
    """What went wrong with one episode (the rows of the table)."""

    SANDBOX_CRASH = "sandbox_crash"
    INIT_FAILURE = "init_failure"
    HARNESS_ERROR = "harness_error"
    INFERENCE_ERROR = "inference_error"
    STALE = "stale"
    TASK_CANCELLED = "task_cancelled"
    PIPELINE_BUG = "pipeline_bug"
    RUN_TIMEOUT = "run_timeout"


@dataclass(frozen=True)
class Outcome:
    """How a fault ends: retried (where), then which status."""

    retry_from: str | None  # "init" (restart the sample), "eval" (rerun the tests), None (final at once)
    status: Status


OUTCOMES: dict[Fault, Outcome] = {
    Fault.SANDBOX_CRASH: Outcome("init", Status.SANDBOX_ERROR),
    Fault.INIT_FAILURE: Outcome("init", Status.SANDBOX_ERROR),
    Fault.HARNESS_ERROR: Outcome("eval", Status.HARNESS_ERROR),
    Fault.INFERENCE_ERROR: Outcome("init", Status.INFERENCE_ERROR),
    Fault.STALE: Outcome("init", Status.CANCELLED),
    Fault.TASK_CANCELLED: Outcome(None, Status.CANCELLED),
    Fault.PIPELINE_BUG: Outcome("init", Status.NODE_ERROR),
    Fault.RUN_TIMEOUT: Outcome(None, Status.TIMEOUT),
}


def classify_run_error(exc: BaseException) -> Fault:
    """The fault behind an exception that escaped the agent episode (RUN)."""
    if isinstance(exc, InferenceError):
        return Fault.INFERENCE_ERROR
    if isinstance(exc, (SandboxError, OSError, EOFError)):
        return Fault.SANDBOX_CRASH  # a dead PTY or socket surfaces as OSError/EOFError
    return Fault.PIPELINE_BUG


def table_rows() -> list[tuple[str, str, str, str]]:
    """The table of the module docstring as rows (fault, retries, final status, in the loss?)."""
    rows: list[tuple[str, str, str, str]] = []
    block = (__doc__ or "").split("\n")
    bars = [i for i, line in enumerate(block) if line.startswith("=====")]
    for line in block[bars[1] + 1:bars[2]]:
        if line.startswith(" "):
            prev = rows[-1]
            rows[-1] = (prev[0], f"{prev[1]} {line.strip()}", prev[2], prev[3])
            continue
        cells = [line[0:30].strip(), line[30:69].strip(), line[69:97].strip(), line[97:].strip()]
        rows.append((cells[0], cells[1], cells[2], cells[3]))
    return rows
