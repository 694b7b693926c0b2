"""The task loader: the built-in set, SWE-bench string-encoded lists, and a battery of malformed lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpc.errors import UsageError
from rollout_node.tasks import TaskInstance, load_tasks, task_from_dict

SHA = "a" * 40
PATCH = "diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n"


def good(**changes: Any) -> dict[str, Any]:
    task = {"instance_id": "o__r-1", "repo": "o/r", "base_commit": SHA, "patch": PATCH, "test_patch": PATCH,
            "FAIL_TO_PASS": ["tests/test_x.py::test_a"], "PASS_TO_PASS": [], "problem_statement": "bug"}
    task.update(changes)
    return {k: v for k, v in task.items() if v is not DROP}


DROP = object()


def write(tmp_path: Path, rows: list[Any]) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_builtin_set_has_twelve_instances_over_three_repos() -> None:
    tasks = load_tasks("builtin")
    assert len(tasks) >= 12
    assert len({t.repo for t in tasks}) >= 3
    assert len({t.instance_id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.FAIL_TO_PASS and t.PASS_TO_PASS and t.problem_statement and t.log_parser == "pytest"
        assert t.patch.startswith("diff --git") and t.test_patch.startswith("diff --git")


def test_swebench_string_lists_and_extra_fields(tmp_path: Path) -> None:
    row = good(FAIL_TO_PASS=json.dumps(["t::a", "t::b"]), PASS_TO_PASS="[]", created_at="2024", hints_text="h")
    [task] = load_tasks(write(tmp_path, [row, ""]))
    assert task.FAIL_TO_PASS == ("t::a", "t::b") and task.PASS_TO_PASS == ()
    assert task.extra == {"created_at": "2024", "hints_text": "h"}
    assert task_from_dict(task.to_dict()) == task
    assert isinstance(task, TaskInstance) and task.log_parser == "pytest" and task.image == ""


@pytest.mark.parametrize(("row", "needle"), [
    (good(repo=DROP), "field 'repo' is missing"),
    (good(base_commit="abc123"), "field 'base_commit' 'abc123' must be a full 40-hex"),
    (good(FAIL_TO_PASS="not json"), "field 'FAIL_TO_PASS' is a string but not JSON"),
    (good(FAIL_TO_PASS=[]), "field 'FAIL_TO_PASS' is empty"),
    (good(PASS_TO_PASS=[1, 2]), "field 'PASS_TO_PASS' must be a list of non-empty test-id strings"),
    (good(PASS_TO_PASS=DROP), "field 'PASS_TO_PASS' is missing"),
    (good(log_parser="nose"), "field 'log_parser' 'nose' is unknown; use one of pytest, unittest"),
    (good(patch="just text"), "field 'patch' is not a unified diff"),
    (good(test_patch=7), "field 'test_patch' must be a string, got int"),
    (good(repo="noslash"), "field 'repo' 'noslash' must look like 'owner/name'"),
    (good(instance_id="a b"), "field 'instance_id' 'a b' may hold only"),
])
def test_malformed_line_names_line_instance_and_field(tmp_path: Path, row: dict[str, Any], needle: str) -> None:
    path = write(tmp_path, [good(instance_id="o__r-0"), row])
    with pytest.raises(UsageError) as exc:
        load_tasks(path)
    msg = str(exc.value)
    assert f"{path}:2" in msg, msg
    assert needle in msg, msg
    if isinstance(row.get("instance_id"), str) and row["instance_id"] != "a b":
        assert "instance 'o__r-1'" in msg


@pytest.mark.parametrize(("line", "needle"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
])
def test_unparsable_lines(tmp_path: Path, line: str, needle: str) -> None:
    path = write(tmp_path, [good(), line])
    with pytest.raises(UsageError, match=needle) as exc:
        load_tasks(path)
    assert f"{path}:2" in str(exc.value)


def test_duplicate_ids_empty_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"tasks.jsonl:2 \(instance 'o__r-1'\): duplicate instance_id, first on line 1"):
        load_tasks(write(tmp_path, [good(), good()]))
    with pytest.raises(UsageError, match="holds no tasks"):
        load_tasks(write(tmp_path, ["", "  "]))
    with pytest.raises(UsageError, match="cannot read the task file"):
        load_tasks(tmp_path / "nope.jsonl")


def test_every_problem_of_a_line_is_reported_together() -> None:
    with pytest.raises(UsageError) as exc:
        task_from_dict(good(repo=DROP, base_commit="x", log_parser="nose"), "t.jsonl:7")
    msg = str(exc.value)
    assert msg.startswith("t.jsonl:7 (instance 'o__r-1'):")
    assert "'repo' is missing" in msg and "'base_commit'" in msg and "'log_parser'" in msg
