"""``CheckpointMeta`` is the one reader/writer of ``meta.json``: the format on disk is unchanged (a
written meta reads back to the same JSON) and a meta of an older version, without the keys added
since, reads with their defaults."""

from __future__ import annotations

from pathlib import Path

from hpc.fsutil import atomic_write_json
from hpc.paths import RunPaths
from train_node.trainer.checkpoint import CheckpointMeta, TrainerState, read_meta

CURRENT = {"step": 4, "policy_version": 2, "parent": "step_000002-g1", "shards": ["a.shard"], "fence_generation": 1,
           "world_size": 2, "zero_stage": 2, "precision": "fp32",
           "trainer_state": {"consumer": {"trained_tasks": ["t1"]}, "feeder": {"next_position": 3},
                             "nonfinite_steps": 1},
           "t": 1.5, "files": {"ledger.jsonl": [10, "ab"]}}


def test_meta_round_trips_through_the_unchanged_format(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    (paths.checkpoints / "step_000004-g1").mkdir(parents=True)
    atomic_write_json(paths.checkpoints / "step_000004-g1" / "meta.json", CURRENT)
    meta = CheckpointMeta.read(paths, "step_000004-g1")
    assert meta.tag == "step_000004-g1" and meta.trainer_state == TrainerState({"trained_tasks": ["t1"]},
                                                                               {"next_position": 3}, 1)
    assert meta.to_json() == CURRENT == read_meta(paths, "step_000004-g1")
    assert meta.needs_universal(1) and not meta.needs_universal(2)


def test_an_older_meta_reads_with_defaults() -> None:
    old = CheckpointMeta.from_json({"step": 3, "parent": None, "shards": ["a.shard"],
                                    "trainer_state": {"consumer": {}}}, "step_000003")
    assert (old.policy_version, old.fence_generation, old.world_size, old.zero_stage, old.files) == (None, 0, None, 0, {})
    assert old.trainer_state == TrainerState({}, {}, 0) and not old.needs_universal(4)
