"""``builtin-lookup*``: the family whose answer is only in a tool observation: generated from its seed, three
disjoint sets selectable by name, the value in a file of the repository and in no message, and scored by the real
EVAL in bwrap (the instance's value earns 1, another value or no edit 0)."""

from __future__ import annotations

import tempfile

import pytest

from hpc.config import SandboxConfig
from rollout_node.tasks import ensure_builtin_repos, harness, load_tasks
from rollout_node.tasks.builtin import HERE, REPOS_DIR, generate
from rollout_node.tasks.builtin.lookup import SETS, answer_of, lookup_specs, setting_files, setting_of, settings

pytestmark = pytest.mark.sandbox


def test_files_are_generated_from_the_seed() -> None:
    for name, (file, _) in SETS.items():
        assert generate.render(lookup_specs(name)) == (HERE / file).read_text(), "run: python -m rollout_node.tasks.builtin.generate"
    root = REPOS_DIR / "lookup"
    assert {str(p.relative_to(root)): p.read_text() for p in (root / "settings").iterdir()} == setting_files()
    assert generate.sync_setting_files(check=True)


def test_three_disjoint_sets_and_the_value_only_in_the_repository() -> None:
    sets = {name: load_tasks(name) for name in SETS}
    assert {name: len(tasks) for name, tasks in sets.items()} == \
        {"builtin-lookup": 64, "builtin-lookup-heldout": 32, "builtin-lookup-warm": 32}
    ids = [t.instance_id for tasks in sets.values() for t in tasks]
    assert len(set(ids)) == len(ids) == 128
    pairs = dict(settings())
    assert len(pairs) == 128 and len(set(pairs.values())) == 128
    names = {name: {t.FAIL_TO_PASS[0].rsplit("test_value_is_", 1)[1] for t in tasks} for name, tasks in sets.items()}
    assert not (names["builtin-lookup"] & names["builtin-lookup-heldout"]) and \
        not (names["builtin-lookup-warm"] & (names["builtin-lookup"] | names["builtin-lookup-heldout"]))
    files = setting_files()
    for task in (t for tasks in sets.values() for t in tasks):
        name = task.FAIL_TO_PASS[0].rsplit("test_value_is_", 1)[1]
        value = answer_of(task)
        assert pairs[name] == value and f"value = {value}\n" in files[f"settings/{name}.ini"]
        assert f"`{name}`" in task.problem_statement and f"settings/{name}.ini" in task.problem_statement
        assert value not in task.problem_statement, task.instance_id
        assert f"== \"{value}\"" in task.test_patch


def test_only_the_files_value_scores_in_the_real_sandbox(tmp_path) -> None:
    cache = tmp_path / "cache"
    ensure_builtin_repos(cache)
    task = load_tasks("builtin-lookup-heldout")[0]
    value = answer_of(task)
    other = str(int(value) % 9000 + 1000 + 1)
    kw = {"sandbox_cfg": SandboxConfig(), "scratch_dir": tmp_path / "scratch", "repo_cache": cache}
    gold = harness.evaluate(task, task.patch, **kw)
    wrong = harness.evaluate(task, task.patch.replace(f'"{value}"', f'"{other}"'), **kw)
    empty = harness.evaluate(task, "", **kw)
    assert (gold.reward, wrong.reward, empty.reward) == (1.0, 0.0, 0.0), (gold.log, wrong.log, empty.log)


def test_warm_transcripts_view_the_file_and_write_its_value(tmp_path) -> None:
    """``lookup_transcripts``: one canonical episode per instance, in order: the value appears first in the
    ``view`` observation (mask 0), then in the policy's edit (mask 1); the statement never holds it."""
    from rollout_node.agent.loop import AgentLimits
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks.builtin.warm import lookup_transcripts
    from train_node.infer.tiny import build_tiny_model

    template = ChatTemplate.from_model_dir(build_tiny_model(tmp_path / "tiny", seed=0))
    tasks = load_tasks("builtin-lookup-warm")[:3]
    got = lookup_transcripts(template, tasks, agent_limits=AgentLimits(max_turns=4, max_new_tokens_per_turn=64),
                             system="Fix it.")
    assert [t.value for t in got] == [answer_of(t) for t in tasks]
    for t in got:
        ids, mask = t.token_ids, t.loss_mask
        policy = template.decode([i for i, m in zip(ids, mask, strict=True) if m], skip_special_tokens=False)
        context = template.decode([i for i, m in zip(ids, mask, strict=True) if not m], skip_special_tokens=False)
        assert policy.count("<tool_call>") == 3 and '"view"' in policy and '"submit"' in policy
        assert f'"new": "{t.value}"' in policy and f"value = {t.value}" in context
        first_policy = mask.index(1)
        assert t.value not in template.decode(ids[:first_policy]), "the statement must not hold the value"


def test_the_stand_in_tools_leave_no_copy_behind(tmp_path, monkeypatch) -> None:
    """``RepoFileTools`` copies the repository into a temporary directory and removes it when closed; the
    transcript builders close theirs (each used to leave a copy in /tmp per call: 19 per suite run)."""
    from rollout_node.agent.loop import AgentLimits
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks.builtin import lookup
    from rollout_node.tasks.builtin.warm import RepoFileTools, lookup_transcripts, transcripts
    from train_node.infer.tiny import build_tiny_model

    template = ChatTemplate.from_model_dir(build_tiny_model(tmp_path / "tiny", seed=0))
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with RepoFileTools(lookup.REPO, (lookup.CONFIG,), lookup.written_value) as tools:
        copy = next(scratch.iterdir())
        assert copy.name.startswith("spoolrl-lookup-") and (copy / lookup.CONFIG).is_file()
    assert not copy.exists()
    tools.close()  # a second close is nothing
    limits = AgentLimits(max_turns=4, max_new_tokens_per_turn=64)
    assert lookup_transcripts(template, load_tasks("builtin-lookup-warm")[:2], agent_limits=limits, drawn_values=1)
    assert transcripts(template, load_tasks("builtin-pick")[:2], 2)
    assert list(scratch.iterdir()) == []


def test_warm_transcripts_with_drawn_values_show_and_write_a_fresh_value_each(tmp_path) -> None:
    """``drawn_values=2``: two episodes per instance, each viewing the instance's setting file, which shows a value
    drawn for that episode, and writing that value; no two drawn values alike and none is any instance's value
    (of any set), so nothing in them can be recalled on another instance. The same seed draws the same values."""
    from rollout_node.agent.loop import AgentLimits
    from rollout_node.agent.template import ChatTemplate
    from rollout_node.tasks.builtin.warm import lookup_transcripts
    from train_node.infer.tiny import build_tiny_model

    template = ChatTemplate.from_model_dir(build_tiny_model(tmp_path / "tiny", seed=0))
    tasks = load_tasks("builtin-lookup-warm")[:3]
    limits = AgentLimits(max_turns=4, max_new_tokens_per_turn=64)
    got = lookup_transcripts(template, tasks, agent_limits=limits, system="Fix it.", drawn_values=2, seed=5)
    assert len(got) == 6
    values = [t.value for t in got]
    assert len(set(values)) == 6 and not set(values) & {v for _, v in settings()}
    for i, t in enumerate(got):
        name = setting_of(tasks[i // 2])
        policy = template.decode([x for x, m in zip(t.token_ids, t.loss_mask, strict=True) if m])
        context = template.decode([x for x, m in zip(t.token_ids, t.loss_mask, strict=True) if not m])
        assert f'"path": "settings/{name}.ini"' in policy and f'"new": "{t.value}"' in policy
        assert f"[{name}]" in context and f"value = {t.value}" in context and answer_of(tasks[i // 2]) not in context
    again = lookup_transcripts(template, tasks, agent_limits=limits, system="Fix it.", drawn_values=2, seed=5)
    assert [t.token_ids for t in again] == [t.token_ids for t in got]
    from rollout_node.tasks.builtin import lookup
    from rollout_node.tasks.builtin.warm import RepoFileTools

    with pytest.raises(ValueError, match="not one of the files this stand-in restores"):
        RepoFileTools(lookup.REPO, (lookup.CONFIG,), lookup.written_value).reset({"settings/x.ini": "[x]\n"})
