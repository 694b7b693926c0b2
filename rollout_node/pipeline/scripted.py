"""ScriptedPolicy: replays fixed tool calls instead of asking an LLM (a test and debugging aid).

It drives the real pipeline (real sandboxes, real EVAL) without an inference server: gold-patch
replay, an empty episode, tampering attempts, and injected faults. Which script runs is chosen
by ``rollout.scripted_plan``: ``"ACTIONS"`` for every task, or ``"GLOB=ACTIONS;GLOB=ACTIONS"``
(first task-id glob that matches wins, ``*`` as the last entry for the rest). ``ACTIONS`` is
``a|b|c``: action ``a`` on attempt 0, ``b`` on attempt 1, the last one for every later attempt.

Actions: ``gold`` (apply the task's gold patch), ``empty`` (look around, change nothing),
``tamper_test`` (rewrite the failing tests to pass), ``tamper_conftest`` (a conftest.py that
reports every test as passed), ``tamper_pth`` (a ``.pth``/``sitecustomize`` hook that does the
same), ``hang`` (one command that never returns, cut by the tool timeout, then gold), ``slow``
(sleeps until the episode is stopped: RUN timeout, cancellation, drain), ``crash`` (the sandbox's
processes are killed under the agent), ``inference_error`` (the "LLM" fails).

Agent-caused faults (issue 13), run through the REAL agent loop with canned completions
(:mod:`rollout_node.pipeline.agentscript`): ``unreadable`` (tracked files and a directory
chmod 000), ``fifo`` (FIFOs and a socket over tracked files), ``rm_control`` (the sandbox's
``.spoolrl`` control directory removed, then the shell killed), ``kill_pytool`` (the python
tool's server killed, then patched to answer garbage and deep nesting), ``forge_marker`` (forged
shell completion markers), ``kill_shell`` (the agent kills its own shell, all its processes,
exits), ``bad_json`` (tool calls with NaN/Infinity, huge and negative numbers, deep nesting,
broken JSON), and ``peek`` (asks git what history it can see; the ids in the spool task's
``peek_objects`` are probed for readability). Each then submits.

Token record (synthetic, documented as such): prompt = the UTF-8 bytes of the problem statement
(+3, so 0..2 stay free), each tool call = the bytes of its command as *generated* tokens with
logprob -0.5 (``logprob_kind`` "synthetic": the trainer refuses them) and the policy version current at that call, each observation = the bytes of the
output as context tokens. The arrays obey every Trajectory rule, so the spool and the trainer's accounting take them.
"""

from __future__ import annotations

import base64
import fnmatch
import shlex
import time

from hpc.errors import InferenceError, SandboxError, UsageError
from hpc.trajectory import Status
from rollout_node.pipeline.agentscript import SCRIPTS, peek_script, run_script
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput

ACTIONS = ("gold", "empty", "tamper_test", "tamper_conftest", "tamper_pth", "hang", "slow", "crash",
           "inference_error", *SCRIPTS, "peek")
_MAX_PIECE = 256
_CONFTEST = '''import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
'''
_PTH_LINE = "import os; os.environ.setdefault('PYTEST_PLUGINS', '_spoolrl_cheat')\n"


def parse_plan(plan: str) -> list[tuple[str, list[str]]]:
    """``"GLOB=a|b;..."`` -> [(glob, [actions])]; a bare ``"a|b"`` applies to every task."""
    entries = []
    for part in (p.strip() for p in plan.split(";")):
        if not part:
            continue
        glob, sep, actions = part.rpartition("=")
        seq = [a.strip() for a in actions.split("|")]
        bad = [a for a in seq if a not in ACTIONS]
        if bad:
            raise UsageError(f"rollout.scripted_plan: unknown action(s) {bad}; known: {', '.join(ACTIONS)}")
        entries.append((glob if sep else "*", seq))
    if not entries:
        raise UsageError("rollout.scripted_plan: empty; e.g. 'gold' or 'task-1=crash|gold;*=empty'")
    return entries


def action_for(plan: list[tuple[str, list[str]]], task_id: str, attempt: int) -> str:
    for glob, seq in plan:
        if fnmatch.fnmatchcase(task_id, glob):
            return seq[min(attempt, len(seq) - 1)]
    return "empty"


def _ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode("utf-8", "replace")[:_MAX_PIECE]]


class ScriptedPolicy:
    """Replays the script of each task (see the module docstring); thread-safe (no shared state)."""

    def __init__(self, plan: str = "gold") -> None:
        self.plan = parse_plan(plan)

    def close(self) -> None:
        return None

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        action = action_for(self.plan, ctx.task_id, ctx.attempt)
        if action in SCRIPTS or action == "peek":
            script = SCRIPTS.get(action) or peek_script([str(o) for o in ctx.claim.fields.get("peek_objects", [])])
            out = run_script(ctx, script)
            out.metrics["scripted_action"] = action
            out.sampling["scripted"] = action
            return out
        ctx.transcript.add_context(_ids(ctx.task.problem_statement or ctx.task_id) or [3])
        status = getattr(self, f"_do_{action}")(ctx)
        return EpisodeOutput(status=status, metrics={"scripted_action": action},
                             sampling={"seed": ctx.seed, "scripted": action}, logprob_kind="synthetic")

    def _call(self, ctx: EpisodeContext, command: str, timeout_s: float | None = None) -> str:
        """One tool call: record the command as generated tokens, run it, record the output."""
        version = ctx.policy_version()
        ids = _ids(command) or [3]
        ctx.transcript.add_generated(ids, [-0.5] * len(ids), [version] * len(ids))
        result = ctx.sandbox.run(command, timeout_s=timeout_s or ctx.tool_timeout_s())
        ctx.transcript.add_context(_ids(result.output) or [3])
        return str(result.output)

    def _write(self, ctx: EpisodeContext, path: str, text: str, append: bool = False) -> None:
        data = base64.b64encode(text.encode()).decode()
        redirect = ">>" if append else ">"
        self._call(ctx, f"mkdir -p \"$(dirname {shlex.quote(path)})\" && echo {data} | base64 -d {redirect} "
                        f"{shlex.quote(path)}")

    def _do_empty(self, ctx: EpisodeContext) -> Status:
        self._call(ctx, "git status --short | head -20")
        return Status.OK

    def _do_gold(self, ctx: EpisodeContext) -> Status:
        data = base64.b64encode(ctx.task.patch.encode()).decode()
        self._call(ctx, f"echo {data} | base64 -d | git apply --whitespace=nowarn - && git status --short")
        return Status.OK

    def _do_tamper_test(self, ctx: EpisodeContext) -> Status:
        for test_id in ctx.task.FAIL_TO_PASS:
            path, _, name = test_id.partition("::")
            func = name.split("::")[-1].split("[")[0] or "test_tampered"
            self._write(ctx, path, f"\n\ndef {func}():\n    pass\n", append=True)
        return Status.OK

    def _do_tamper_conftest(self, ctx: EpisodeContext) -> Status:
        self._write(ctx, "conftest.py", _CONFTEST)
        for test_id in ctx.task.FAIL_TO_PASS:
            test_dir = test_id.partition("::")[0].rpartition("/")[0]
            if test_dir:
                self._write(ctx, f"{test_dir}/conftest.py", _CONFTEST)
        return Status.OK

    def _do_tamper_pth(self, ctx: EpisodeContext) -> Status:
        self._write(ctx, "_spoolrl_cheat.py", _CONFTEST)  # a pytest plugin that passes everything
        self._write(ctx, "zz_spoolrl_cheat.pth", _PTH_LINE)
        self._write(ctx, "sitecustomize.py", _PTH_LINE)
        self._call(ctx, "site=$(python3 -c 'import site; print(site.getusersitepackages())' 2>/dev/null) && "
                        "mkdir -p \"$site\" && cp zz_spoolrl_cheat.pth _spoolrl_cheat.py \"$site\"/ 2>&1 | tail -1")
        return Status.OK

    def _do_hang(self, ctx: EpisodeContext) -> Status:
        self._call(ctx, "sleep 3600", timeout_s=min(ctx.tool_timeout_s(), 2.0))
        return self._do_gold(ctx)

    def _do_slow(self, ctx: EpisodeContext) -> Status:
        while not ctx.should_stop():
            self._call(ctx, "sleep 0.5", timeout_s=2.0)
        return Status.TIMEOUT if ctx.remaining_s() <= 0 else Status.OK

    def _do_crash(self, ctx: EpisodeContext) -> Status:
        self._call(ctx, "true")
        ctx.sandbox.close()  # what the OOM killer or a node fault does to every process of a sandbox
        try:
            self._call(ctx, "git status --short")
        except SandboxError:
            raise
        except Exception as exc:  # noqa: BLE001 - however a dead sandbox answers, it is a crash
            raise SandboxError(f"scripted crash: the sandbox is gone ({type(exc).__name__}: {exc})") from exc
        raise SandboxError("scripted crash: the sandbox was killed under the agent")

    def _do_inference_error(self, ctx: EpisodeContext) -> Status:
        time.sleep(0.05)
        raise InferenceError("scripted inference error: no server could answer")
