"""Task instances in the SWE-bench JSONL format, and the loader that validates them.

Guarantees:
- :class:`TaskInstance` is frozen and holds the SWE-bench fields (``instance_id``, ``repo``,
  ``base_commit``, ``problem_statement``, ``patch``, ``test_patch``, ``FAIL_TO_PASS``,
  ``PASS_TO_PASS``) plus an environment (``image``, ``environment_setup_commit``, ``version``),
  an optional ``test_cmd`` and a named ``log_parser``. Unknown extra fields (SWE-Gym, R2E-Gym
  metadata such as ``created_at`` or ``hints_text``) are kept in ``extra`` untouched.
- ``FAIL_TO_PASS``/``PASS_TO_PASS`` are accepted as lists or as JSON strings holding lists (the way
  the SWE-bench dataset stores them); both become tuples of test ids.
- :func:`load_tasks` reads ``"builtin"`` or a JSONL path; every problem is reported as a
  :class:`~hpc.errors.UsageError` naming the file, line number, instance and field, and the fix.
  Nothing is silently dropped: blank lines are the only lines skipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.errors import UsageError

LOG_PARSERS = ("pytest", "unittest")
REQUIRED_TEXT = ("instance_id", "repo", "base_commit", "patch", "test_patch")
OPTIONAL_TEXT = ("problem_statement", "image", "environment_setup_commit", "version", "test_cmd", "log_parser")
TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS")
_SHA = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_ID = re.compile(r"^[A-Za-z0-9_.@+-]+$")


@dataclass(frozen=True)
class TaskInstance:
    """One task: a repository at ``base_commit``, a bug to fix, and the tests that decide the reward."""

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    FAIL_TO_PASS: tuple[str, ...]
    PASS_TO_PASS: tuple[str, ...]
    problem_statement: str = ""
    image: str = ""  # '' = the sandbox's configured/default image
    environment_setup_commit: str = ""
    version: str = ""
    test_cmd: str = ""  # '' = the harness's hardened pytest runner
    log_parser: str = "pytest"
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def tests(self) -> tuple[str, ...]:
        """Every test that must pass for reward 1 (FAIL_TO_PASS first, no duplicates)."""
        return tuple(dict.fromkeys(self.FAIL_TO_PASS + self.PASS_TO_PASS))

    def to_dict(self) -> dict[str, Any]:
        """The JSONL form (lists as lists); round-trips through :func:`task_from_dict`."""
        out: dict[str, Any] = dict(self.extra)
        for name in REQUIRED_TEXT + OPTIONAL_TEXT:
            out[name] = getattr(self, name)
        for name in TEST_LISTS:
            out[name] = list(getattr(self, name))
        return out


def task_from_dict(data: Any, where: str = "task") -> TaskInstance:
    """Validate one decoded JSON object; raise UsageError listing every problem with its field."""
    if not isinstance(data, dict):
        raise UsageError(f"{where}: expected a JSON object (one task per line), got {type(data).__name__}")
    label = f"{where} (instance {data.get('instance_id')!r})" if isinstance(data.get("instance_id"), str) else where
    problems: list[str] = []
    values: dict[str, Any] = {}
    for name in REQUIRED_TEXT + OPTIONAL_TEXT:
        values[name] = _text_field(data, name, name in REQUIRED_TEXT, problems)
    for name in TEST_LISTS:
        values[name] = _test_list(data, name, problems)
    problems.extend(_semantic_problems(values))
    if problems:
        raise UsageError(f"{label}: " + "; ".join(problems))
    values["log_parser"] = values["log_parser"] or "pytest"
    extra = {k: v for k, v in data.items() if k not in values}
    return TaskInstance(**values, extra=extra)


def _text_field(data: dict[str, Any], name: str, required: bool, problems: list[str]) -> str:
    value = data.get(name)
    if value is None:
        if required:
            problems.append(f"field {name!r} is missing; every SWE-bench task line needs it")
        return ""
    if not isinstance(value, str):
        problems.append(f"field {name!r} must be a string, got {type(value).__name__}")
        return ""
    if required and not value.strip():
        problems.append(f"field {name!r} is empty")
    return value


def _test_list(data: dict[str, Any], name: str, problems: list[str]) -> tuple[str, ...]:
    value = data.get(name)
    if value is None:
        problems.append(f"field {name!r} is missing; give a list of test ids (may be empty for PASS_TO_PASS)")
        return ()
    if isinstance(value, str):  # the SWE-bench dataset stores these as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            problems.append(f"field {name!r} is a string but not JSON; give a list like [\"tests/test_x.py::test_y\"]")
            return ()
    if not isinstance(value, list) or not all(isinstance(t, str) and t.strip() for t in value):
        problems.append(f"field {name!r} must be a list of non-empty test-id strings")
        return ()
    if not value and name == "FAIL_TO_PASS":
        problems.append("field 'FAIL_TO_PASS' is empty; a task needs at least one test that the fix makes pass")
    return tuple(value)


def _semantic_problems(values: dict[str, Any]) -> list[str]:
    problems = []
    if values["instance_id"] and not _ID.match(values["instance_id"]):
        problems.append(f"field 'instance_id' {values['instance_id']!r} may hold only letters, digits and _.@+-")
    if values["repo"] and not _REPO.match(values["repo"]):
        problems.append(f"field 'repo' {values['repo']!r} must look like 'owner/name'")
    if values["base_commit"] and not _SHA.match(values["base_commit"]):
        problems.append(f"field 'base_commit' {values['base_commit']!r} must be a full 40-hex git commit id")
    if values["log_parser"] and values["log_parser"] not in LOG_PARSERS:
        problems.append(f"field 'log_parser' {values['log_parser']!r} is unknown; use one of {', '.join(LOG_PARSERS)}")
    for name in ("patch", "test_patch"):
        text = values[name]
        if text.strip() and "--- " not in text and "diff --git" not in text:
            problems.append(f"field {name!r} is not a unified diff (no '---' header)")
    return problems


def parse_jsonl(lines: Iterable[str], source: str) -> list[TaskInstance]:
    """Parse task lines; the first bad line raises UsageError naming ``source:line``."""
    tasks: list[TaskInstance] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); "
                             "write one JSON object per line") from exc
        task = task_from_dict(data, where)
        if task.instance_id in seen:
            raise UsageError(f"{where} (instance {task.instance_id!r}): duplicate instance_id, first on line "
                             f"{seen[task.instance_id]}; instance ids must be unique")
        seen[task.instance_id] = number
        tasks.append(task)
    return tasks


def task_file(source: str | Path) -> Path:
    """The JSONL file of ``tasks.source``: a built-in set's shipped file, else the path itself."""
    from hpc.config.tasks import builtin_task_file

    builtin = builtin_task_file(str(source))
    if builtin is not None:
        from rollout_node.tasks.builtin import HERE
        return HERE / builtin
    return Path(source)


def load_tasks(source: str | Path) -> list[TaskInstance]:
    """A built-in set's name (``"builtin"``, ``"builtin-pick"``) or a path to a SWE-bench-style JSONL file."""
    path = task_file(source)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the task file ({exc.strerror}); give a JSONL path or 'builtin'") from exc
    tasks = parse_jsonl(text.splitlines(), str(path))
    if not tasks:
        raise UsageError(f"{path}: holds no tasks; write one SWE-bench JSON object per line")
    return tasks
