"""The learnable built-in family ``builtin-pick``: generated from its spec, selectable by name, and scored by
the real EVAL in bwrap: only the value the statement names earns reward 1; every other answer scores 0."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hpc.config import SandboxConfig
from rollout_node.tasks import ensure_builtin_repos, harness, load_tasks
from rollout_node.tasks.builtin import PICK_JSONL, generate
from rollout_node.tasks.builtin.pick import CONFIG, REPEATS, VALUES, answer_of, pick_specs, single_token_values
from rollout_node.tasks.instance import task_file
from train_node.trainer.feeder import instance_ids_for

pytestmark = pytest.mark.sandbox


def test_pick_jsonl_is_generated_from_the_spec() -> None:
    assert generate.render(pick_specs()) == PICK_JSONL.read_text(), "run: python -m rollout_node.tasks.builtin.generate"


def test_selected_by_name_and_every_statement_names_its_own_answer() -> None:
    tasks = load_tasks("builtin-pick")
    assert len(tasks) == 16 and {t.repo for t in tasks} == {"spoolrl/summary"}
    assert instance_ids_for(task_file("builtin-pick")) == [t.instance_id for t in tasks]
    assert {t.instance_id for t in load_tasks("builtin")}.isdisjoint(t.instance_id for t in tasks)
    answers = [answer_of(t) for t in tasks]
    assert sorted(set(answers)) == sorted(VALUES) and len(VALUES) >= 4
    assert all(answers.count(v) == len(tasks) // len(VALUES) for v in VALUES)
    k = len(VALUES)  # the file lists the values in turn: with tasks.order: file each step of k groups is balanced
    assert all(sorted(answers[i:i + k]) == sorted(VALUES) for i in range(0, len(tasks), k)), answers
    for task, answer in zip(tasks, answers, strict=True):
        named = set(re.findall(r"`(\w+)`", task.problem_statement)) & set(VALUES)
        assert named == {answer}, (task.instance_id, task.problem_statement)
        assert task.problem_statement.count(f"`{answer}`") >= REPEATS + 2  # named in the opening, asked, insisted on
        assert f'+AGGREGATE = "{answer}"' in task.patch and CONFIG in task.patch
    statements = {t.problem_statement.replace(f"`{answer_of(t)}`", "`?`") for t in tasks}
    assert len(statements) >= 4, "the openings must differ"


def test_values_are_single_tokens_of_the_tiny_tokenizer(tmp_path: Path) -> None:
    from rollout_node.agent.template import ChatTemplate
    from train_node.infer.tiny import build_tiny_model

    template = ChatTemplate.from_model_dir(build_tiny_model(tmp_path / "tiny", seed=0))
    assert single_token_values(template.encode_content)
    assert not single_token_values(lambda text: template.encode_content(text.replace("max", "maximum")))


def test_only_the_named_value_scores_in_the_real_sandbox(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ensure_builtin_repos(cache)
    tasks = load_tasks("builtin-pick")
    task = next(t for t in tasks if answer_of(t) == "last")
    rewards = {}
    for value in VALUES:
        diff = task.patch.replace('"last"', f'"{value}"')
        result = harness.evaluate(task, diff, sandbox_cfg=SandboxConfig(), scratch_dir=tmp_path / "scratch",
                                  repo_cache=cache)
        assert result.status == "ok", result.log
        rewards[value] = result.reward
    empty = harness.evaluate(task, "", sandbox_cfg=SandboxConfig(), scratch_dir=tmp_path / "scratch", repo_cache=cache)
    assert rewards == {"min": 0.0, "max": 0.0, "first": 0.0, "last": 1.0} and empty.reward == 0.0, empty.log
    other = next(t for t in tasks if answer_of(t) == "min")
    assert harness.evaluate(other, other.patch, sandbox_cfg=SandboxConfig(), scratch_dir=tmp_path / "scratch",
                            repo_cache=cache).reward == 1.0


def test_balanced_warm_transcripts_write_every_value_for_each_statement(tmp_path: Path) -> None:
    """``transcripts(balanced=True)``: consecutive sets of K, one statement each, every value once (the
    sets ``WarmSpec.group`` keeps whole); ``system`` replaces the agent's system prompt in the IDs."""
    from rollout_node.agent.prompts import SYSTEM_PROMPT
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks.builtin.warm import transcripts, value_prefix
    from train_node.infer.tiny import build_tiny_model

    template = ChatTemplate.from_model_dir(build_tiny_model(tmp_path / "tiny", seed=0))
    tasks = load_tasks("builtin-pick")
    k = len(VALUES)
    got = transcripts(template, tasks, 3 * k, seed=5, balanced=True)
    for s in range(3):
        chunk = got[s * k:(s + 1) * k]
        assert [t.value for t in chunk] == list(VALUES)
        assert len({t.answer for t in chunk}) == 1
        prompt_ends = {tuple(t.token_ids[:t.loss_mask.index(1)]) for t in chunk}
        assert len(prompt_ends) == 1, "one statement per set"
    with pytest.raises(AssertionError, match="sets of"):
        transcripts(template, tasks, k + 1, balanced=True)
    plain = transcripts(template, tasks, 8, seed=5)
    assert len({t.value for t in plain}) > 1
    short = "Fix it."
    (mine, _), (default, _) = value_prefix(template, tasks[0], system=short), value_prefix(template, tasks[0])
    assert len(mine) < len(default) and default == value_prefix(template, tasks[0], system=SYSTEM_PROMPT)[0]
    first = transcripts(template, tasks[:1], 1, seed=5, system=short)[0]
    assert first.token_ids[:len(mine)] == mine
