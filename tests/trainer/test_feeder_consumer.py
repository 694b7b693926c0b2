"""Feeder order/backpressure/resume and consumer accounting, against the real spool (no DeepSpeed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpc.config import AlgorithmConfig
from hpc.spool import Spool
from train_node.trainer.consumer import Consumer, ConsumerState
from train_node.trainer.feeder import Feeder, epoch_order

from .helpers import make_group, write_groups


class _Resolved:
    """A stand-in consumer: which tasks are resolved, which are held."""

    def __init__(self) -> None:
        self.resolved: set[str] = set()
        self.held: set[str] = set()

    def is_resolved(self, task_id: str) -> bool:
        return task_id in self.resolved

    def held_tasks(self) -> set[str]:
        return set(self.held)


def test_feeder_ids_order_backpressure_and_resume(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    ids = [f"inst-{i}" for i in range(5)]
    f = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=3)
    c = _Resolved()
    assert f.top_up(spool, c, policy_version=0) == 3
    assert f.top_up(spool, c, policy_version=0) == 0  # 3 outstanding: full
    c.resolved |= set(list(f.outstanding)[:2])
    assert f.top_up(spool, c, policy_version=1) == 2
    order0 = epoch_order(ids, 7, 0)
    assert f.task_at(0, 0)["task_id"] == f"{order0[0]}@e0"
    assert f.task_at(5, 0)["task_id"] == f"{epoch_order(ids, 7, 1)[0]}@e1"
    assert order0 != epoch_order(ids, 7, 1) and sorted(order0) == sorted(ids)
    in_file_order = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=3, shuffle=False)  # tasks.order: file
    assert [in_file_order.task_at(p, 0)["instance_id"] for p in range(10)] == ids + ids
    assert f.task_at(3, 9)["policy_version"] == 9 and f.task_at(3, 9)["group_size"] == 4
    # resume from a checkpoint taken at position 2: re-putting positions 2..4 is a no-op in the spool
    g = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=10)
    g.restore({"next_position": 2, "outstanding": []})
    before = spool.stats()["tasks_ready"]
    g.top_up(spool, c, policy_version=3)
    assert spool.stats()["tasks_ready"] == before + (10 - 5)
    assert g.exhausted and not g.finished
    saved = g.to_json()
    h = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=10)
    h.restore(json.loads(json.dumps(saved)))
    assert h.outstanding == g.outstanding and h.next_position == 10


def test_consumer_outcomes_and_restart_skip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    groups = [make_group("a@e0", [1, 0, 1, 0], rng, version=4), make_group("b@e0", [1, 1, 1, 1], rng, version=4),
              make_group("c@e0", [1, 0, 0, 0], rng, version=0), make_group("d@e0", [0, 1, 0, 1], rng, version=3)]
    write_groups(tmp_path, groups)
    acfg = AlgorithmConfig(group_size=4, groups_per_step=2, max_staleness=2)
    spool = Spool(tmp_path)
    spool.fence("t")
    c = Consumer(spool, "t", acfg, max_seq_len=1000)
    c.poll()
    batch = c.next_batch(trainer_version=5, num_groups=2)  # c is stale at version 5
    assert batch is not None and batch.task_ids == ["a@e0", "d@e0"]
    assert c.drops == {"zero_variance": 4, "stale": 4}
    assert abs(sum(s.advantage for s in batch.samples)) < 1e-6
    c.mark_trained(batch, step=1)
    ledger, covered, state = c.take_checkpoint_delta()
    assert len(ledger) == 16 and len({e["trajectory_id"] for e in ledger}) == 16 and len(covered) == 4
    assert set(state["trained_tasks"]) == {"a@e0", "d@e0"}
    # the same task again (another writer): never trained twice in the lineage
    write_groups(tmp_path, [make_group("a@e0", [1, 0, 0, 1], rng, group="a@e0#2")], worker="other")
    c2 = Consumer(spool, "t", acfg, max_seq_len=1000, state=ConsumerState.from_json(state))
    c2.poll()
    assert c2.next_batch(5, 1, allow_partial=True) is None
    assert sum(c2.drops.values()) == 4 and set(c2.drops) == {"duplicate_task"}


def test_batch_advantages_span_the_groups_of_the_step(tmp_path: Path) -> None:
    """algorithm.advantage_norm=batch_*: the step's groups share one baseline, so a group that all failed is
    trained (pushed down) and one that all passed is pushed up; each group's own norm would give both zeros."""
    rng = np.random.default_rng(3)
    write_groups(tmp_path, [make_group("a@e0", [0, 0, 0, 0], rng), make_group("b@e0", [1, 1, 1, 0], rng),
                            make_group("c@e0", [1, 1, 1, 1], rng)])
    advantages = {}
    for norm in ("batch_mean", "batch_std", "group_std"):
        spool = Spool(tmp_path)
        spool.fence(norm)
        acfg = AlgorithmConfig(group_size=4, groups_per_step=3, drop_zero_variance=False, advantage_norm=norm)
        c = Consumer(spool, norm, acfg, max_seq_len=1000)
        c.poll()
        batch = c.next_batch(trainer_version=0, num_groups=3)
        assert batch is not None and sorted(batch.task_ids) == ["a@e0", "b@e0", "c@e0"]
        advantages[norm] = {s.trajectory_id: s.advantage for s in batch.samples}
        spool.recover(norm, [])
    group_adv = advantages["group_std"]
    assert all(group_adv[f"{t}@e0/s{i}"] == 0 for t in "ac" for i in range(4))
    for norm in ("batch_mean", "batch_std"):
        adv = advantages[norm]
        assert all(adv[f"a@e0/s{i}"] < 0 for i in range(4)) and all(adv[f"c@e0/s{i}"] > 0 for i in range(4)), norm
        assert abs(sum(adv.values())) < 1e-6 and adv["b@e0/s0"] == adv["c@e0/s0"]
    assert advantages["batch_mean"]["a@e0/s0"] == -7 / 12, "r - mean over the 12 samples of the step"


def test_checkpoints_cli_lists_lineage(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "checkpoints" / "step_000002").mkdir(parents=True)
    (root / "checkpoints" / "step_000004" / "ds").mkdir(parents=True)
    meta2 = {"step": 2, "policy_version": 2, "parent": None, "shards": ["s1", "s2"], "world_size": 1}
    meta4 = {"step": 4, "policy_version": 5, "parent": "step_000002", "shards": ["s3"], "world_size": 2}
    (root / "checkpoints" / "step_000002" / "meta.json").write_text(json.dumps(meta2))
    (root / "checkpoints" / "step_000004" / "meta.json").write_text(json.dumps(meta4))
    (root / "checkpoints" / "LATEST").write_text("step_000004\n")
    out = subprocess.run([sys.executable, "-m", "hpc.cli", "checkpoints", str(root), "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = json.loads(out)["checkpoints"]
    assert [(r["step"], r["policy_version"], r["shards"], r["has_state"]) for r in rows] == \
        [(2, 2, ["s1", "s2"], False), (4, 5, ["s3"], True)]
    table = subprocess.run([sys.executable, "-m", "hpc.cli", "checkpoints", str(root)], capture_output=True,
                           text=True, check=True).stdout
    assert "step_000004" in table and "s3" in table


def _restamp(group: list, **changes: object) -> list:
    """The same samples with some fields changed (frozen records: rebuilt, validated again)."""
    import dataclasses

    return [dataclasses.replace(t, **changes) for t in group]


def test_consumer_refuses_what_the_trainer_cannot_reproduce(tmp_path: Path) -> None:
    """Raw or unknown logprobs, greedy or nucleus sampling, one stale member: the WHOLE group is
    dropped with the reason named; only the reproducible group trains."""
    rng = np.random.default_rng(1)
    groups = [
        _restamp(make_group("raw@e0", [1, 0], rng), logprob_kind="raw"),
        _restamp(make_group("unknown@e0", [1, 0], rng), logprob_kind="unknown"),
        _restamp(make_group("greedy@e0", [1, 0], rng), sampling={"temperature": 0.0}),
        _restamp(make_group("nucleus@e0", [1, 0], rng), sampling={"temperature": 0.7, "top_p": 0.9}),
        _restamp(make_group("unrecorded@e0", [1, 0], rng), sampling={}),
        make_group("late@e0", [1, 0], rng, version=1)[:1] + make_group("late@e0", [1, 0], rng, version=5)[1:],
        _restamp(make_group("good@e0", [1, 0], rng, version=5), sampling={"temperature": 0.7}),
    ]
    write_groups(tmp_path, groups)
    spool = Spool(tmp_path)
    spool.fence("t")
    c = Consumer(spool, "t", AlgorithmConfig(group_size=2, groups_per_step=1, max_staleness=2), max_seq_len=1000)
    c.poll()
    batch = c.next_batch(trainer_version=6, num_groups=1)
    assert batch is not None and batch.task_ids == ["good@e0"]
    assert [s.temperature for s in batch.samples] == [0.7, 0.7]
    assert c.drops == {"logprob_kind:raw": 2, "logprob_kind:unknown": 2, "sampling:unsupported": 4,
                       "sampling:unrecorded": 2, "stale": 2}


def test_truncated_and_timeout_are_scored_or_masked(tmp_path: Path) -> None:
    """'mask' keeps the sample's reward in the group baseline but trains none of its tokens. By default both are
    scored: a timeout is the agent's own commands' doing (inference wait is off the clock)."""
    rng = np.random.default_rng(2)
    group = make_group("g@e0", [1.0, 0.0, 0.0], rng)
    group = [group[0], _restamp([group[1]], status="timeout")[0], _restamp([group[2]], status="truncated")[0]]
    write_groups(tmp_path, [group])
    outcomes = {}
    for name, acfg in {"mask": AlgorithmConfig(group_size=3, groups_per_step=1, timeout="mask", truncated="mask"),
                       "score": AlgorithmConfig(group_size=3, groups_per_step=1, timeout="score", truncated="score"),
                       "default": AlgorithmConfig(group_size=3, groups_per_step=1)}.items():
        spool = Spool(tmp_path)
        spool.fence(name)
        c = Consumer(spool, name, acfg, max_seq_len=1000)
        c.poll()
        batch = c.next_batch(trainer_version=0, num_groups=1)
        assert batch is not None
        outcomes[name] = ([s.advantage for s in batch.samples], [s.num_loss_tokens for s in batch.samples],
                          batch.masked)
        spool.recover(name, [])  # give the shard back for the next consumer
    adv_mask, tokens_mask, masked = outcomes["mask"]
    adv_score, tokens_score, _ = outcomes["score"]
    assert adv_mask == adv_score and adv_mask[0] > 0 > adv_mask[1]  # same baseline either way
    assert masked == 2 and tokens_mask[1:] == [0, 0] and tokens_mask[0] > 0
    assert all(n > 0 for n in tokens_score)
    assert outcomes["default"] == outcomes["score"]
