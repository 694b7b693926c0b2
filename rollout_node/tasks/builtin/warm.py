"""Warm-start transcripts: format-only episodes of ``builtin-pick``, demonstrations of ``builtin-lookup-warm``.

Guarantees:
- Token-exact: a transcript is what the real :class:`~rollout_node.agent.loop.AgentLoop` records for
  the episode (the real ChatTemplate pieces, system prompt, observation wrapping and budget), driven
  by a scripted policy that emits the canonical tool calls (:func:`~rollout_node.tasks.builtin.pick.solution_calls`)
  and by tools whose ``str_replace`` is the sandbox's own host-side implementation on a copy of the
  repository's file. A model trained on them has seen exactly the IDs it will be prompted with.
- Format only: the value a transcript writes is drawn uniformly from ``VALUES``, independently of
  the statement (``rng`` decides both, separately), so the statement carries no information about
  the answer in this data. A model fitted to it scores 1/K in expectation before RL.
- :func:`lookup_transcripts`: the canonical episode of each given ``builtin-lookup`` instance (view the
  setting's file, write its value, submit), token-exact in the same way (``view`` and ``str_replace`` are the
  sandbox's host-side file tools). Callers give it only ``builtin-lookup-warm``, the set disjoint from the
  training and held-out ones, so a model fitted to it has seen the tool protocol, never an instance it is
  trained or evaluated on. With ``drawn_values``, each episode's file shows a value drawn for it (none is any
  instance's), so no value in the data can be recalled elsewhere, only copied.
- Imports no torch: the model side (training, sampling) is ``train_node.infer.warm``.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout_node.agent.loop import AgentLimits, AgentLoop
from rollout_node.agent.policy import Completion, SamplingParams
from rollout_node.agent.prompts import SYSTEM_PROMPT, task_messages
from rollout_node.agent.template import ChatTemplate
from rollout_node.agent.toolcall import ToolCall, format_tool_call
from rollout_node.agent.tools import ToolOutput
from rollout_node.tasks.builtin import REPOS_DIR, lookup
from rollout_node.tasks.builtin.pick import CONFIG, VALUES, answer_of, solution_calls, written_value
from rollout_node.tasks.instance import TaskInstance


@dataclass(frozen=True)
class Transcript:
    """One episode as the trainer would see it: IDs and the mask of the policy's own tokens."""

    token_ids: list[int]
    loss_mask: list[int]
    value: str
    answer: str


class _Script:
    """A policy that speaks the given tool calls, one per turn, as canonical token IDs."""

    def __init__(self, template: ChatTemplate, calls: Sequence[tuple[str, dict[str, Any]]]) -> None:
        self.turns = [[*template.encode_content(format_tool_call(n, a)), template.im_end] for n, a in calls]

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        ids = tuple(self.turns.pop(0)[: sampling.max_tokens])
        return Completion(token_ids=ids, logprobs=(0.0,) * len(ids), versions=(0,) * len(ids))


class RepoFileTools:
    """view/str_replace/submit on a private copy of a packaged repository (the sandbox's file tools, no sandbox).

    Each episode starts from the pristine repository (``reset`` restores the ``edited`` files); ``written``
    is what the episode's last successful edit wrote (``written_value`` of its arguments). The copy lives in a
    temporary directory removed by :meth:`close` (``with RepoFileTools(...) as tools:``), or at the latest when
    the object is collected or the interpreter exits.
    """

    def __init__(self, repo: str = "summary", edited: Sequence[str] = (CONFIG,),
                 written_value: Callable[[Mapping[str, Any]], str | None] = written_value) -> None:
        from rollout_node.sandbox.files import FileTools

        self._source = REPOS_DIR / repo
        self._tmp = tempfile.TemporaryDirectory(prefix=f"spoolrl-{repo}-")
        self._dir = Path(self._tmp.name)
        shutil.copytree(self._source, self._dir, dirs_exist_ok=True)
        self._files = FileTools(self._dir, "/work", keep=64 * 1024, max_file_bytes=1 << 20)
        self._edited, self._written_value = tuple(edited), written_value
        self.written: str | None = None
        self.reset()

    def close(self) -> None:
        """Remove the copy (closing again does nothing)."""
        self._tmp.cleanup()

    def __enter__(self) -> RepoFileTools:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reset(self, files: Mapping[str, str] | None = None) -> None:
        """The pristine repository again, then ``files`` (path -> text; each must be one of ``edited``) written."""
        for rel in self._edited:
            (self._dir / rel).write_text((self._source / rel).read_text())
        for rel, text in (files or {}).items():
            if rel not in self._edited:
                raise ValueError(f"{rel}: not one of the files this stand-in restores ({', '.join(self._edited)})")
            (self._dir / rel).write_text(text)
        self.written = None

    def execute(self, call: ToolCall) -> ToolOutput:
        a = call.arguments
        if call.name == "view":
            result = self._files.view(a["path"])
        elif call.name == "str_replace":
            result = self._files.str_replace(a["path"], a["old"], a["new"])
            if result.exit_code == 0:
                self.written = self._written_value(a)
        else:
            return ToolOutput(text=f"error: {call.name} is not available in this stand-in\n", exit_code=1)
        return ToolOutput(text=str(result.output), exit_code=result.exit_code)

    def submit(self) -> ToolOutput:
        return ToolOutput(text="")


def limits(max_new_tokens_per_turn: int = 64, temperature: float = 1.0) -> AgentLimits:
    """The agent budget the demo runs builtin-pick with (two turns: edit, submit)."""
    return AgentLimits(max_turns=3, max_tokens=1024, max_new_tokens_per_turn=max_new_tokens_per_turn,
                       observation_max_tokens=128, temperature=temperature)


def transcripts(template: ChatTemplate, tasks: Sequence[TaskInstance], n: int, *, seed: int = 0,
                agent_limits: AgentLimits | None = None, balanced: bool = False,
                system: str = SYSTEM_PROMPT) -> list[Transcript]:
    """``n`` canonical episodes: statement and written value drawn independently and uniformly.

    ``balanced``: ``n / K`` statements drawn, each written once with every value in turn (consecutive
    sets of K, for ``WarmSpec.group``): the values are exactly uniform for every statement, not only
    in expectation."""
    rng_task, rng_value = random.Random(seed), random.Random(seed + 7919)
    loop = AgentLoop(template, agent_limits or limits())
    if balanced:
        assert n % len(VALUES) == 0, f"balanced transcripts come in sets of {len(VALUES)}"
        draws = [(task, value) for task in (rng_task.choice(list(tasks)) for _ in range(n // len(VALUES)))
                 for value in VALUES]
    else:
        draws = [(rng_task.choice(list(tasks)), rng_value.choice(VALUES)) for _ in range(n)]
    out = []
    with RepoFileTools() as tools:
        for task, value in draws:
            tools.reset()
            result = loop.run(task_messages(task.problem_statement, system=system),
                              _Script(template, solution_calls(value)), tools)
            assert result.submitted and tools.written == value, (result.stop_reason, result.error)
            out.append(Transcript(list(result.token_ids), list(result.loss_mask), value, answer_of(task)))
    return out


def value_prefix(template: ChatTemplate, task: TaskInstance, *,
                 system: str = SYSTEM_PROMPT) -> tuple[list[int], list[int]]:
    """(IDs up to the value in the canonical first turn, the ID of each value in VALUES order)."""
    first = template.first_prompt(task_messages(task.problem_statement, system=system))
    calls = [template.encode_content(format_tool_call(*solution_calls(v)[0])) for v in VALUES]
    cut = next(i for i in range(len(calls[0])) if len({c[i] for c in calls}) > 1)
    assert all(c[:cut] == calls[0][:cut] for c in calls), "the values must follow one common prefix"
    return first + calls[0][:cut], [c[cut] for c in calls]


def lookup_transcripts(template: ChatTemplate, tasks: Sequence[TaskInstance], *, agent_limits: AgentLimits,
                       system: str = SYSTEM_PROMPT, drawn_values: int = 0, seed: int = 0) -> list[Transcript]:
    """The canonical episode of each ``builtin-lookup`` instance of ``tasks``, in order (see the module's
    Guarantees: give it ``builtin-lookup-warm`` only).

    ``drawn_values`` = n > 0: n episodes per instance instead, each with the setting's file showing a value
    drawn at random (``seed``; no two alike, and none is the value of any instance of any set) and the edit
    writing that value. A value is then seen once, so a model fitted to these cannot recall a value: it must
    copy it from the observation. (With each instance's own value, 16 steps of 4 over the 32 instances taught
    the model those values: measured, on instances it had not seen it wrote made-up digits.)"""
    loop = AgentLoop(template, agent_limits)
    files = [lookup.setting_path(lookup.setting_of(t)) for t in tasks] if drawn_values else []
    drawn: Iterator[str] = iter(())
    if drawn_values:  # 4-digit values no instance of any set has
        taken = {value for _, value in lookup.settings()}
        pool = [str(v) for v in range(1000, 10000) if str(v) not in taken]
        drawn = iter(random.Random(seed).sample(pool, len(tasks) * drawn_values))
    out = []
    with RepoFileTools(lookup.REPO, (lookup.CONFIG, *files), lookup.written_value) as tools:
        for task in tasks:
            name = lookup.setting_of(task)
            for value in [next(drawn) for _ in range(drawn_values)] or [lookup.answer_of(task)]:
                tools.reset({lookup.setting_path(name): lookup.setting_text(name, value)} if drawn_values else None)
                result = loop.run(task_messages(task.problem_statement, system=system),
                                  _Script(template, lookup.solution_calls(name, value)), tools)
                assert result.submitted and tools.written == value, (task.instance_id, result.stop_reason,
                                                                      result.error)
                out.append(Transcript(list(result.token_ids), list(result.loss_mask), value, value))
    return out
