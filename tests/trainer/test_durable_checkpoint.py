"""Checkpoints are durable before anything depends on them (issue 14, item 4).

A real DeepSpeed trainer (1 rank, gloo) checkpoints at steps 2 and 4 and commits every shard. Every
file of a checkpoint was fsynced before LATEST named it. Then the newest checkpoint is torn (its
model state cut in half, as a storage fault would leave it): the next trainer finds it against
the manifest, falls back to step 2, returns the shards committed after the torn checkpoint to the
spool and trains them again - the same losses - so every trajectory is in the surviving lineage's
ledgers exactly once and nothing committed is lost.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpc.metrics import read_metrics
from hpc.spool import Spool
from train_node.trainer import checkpoint as ckpt
from train_node.trainer.loop import Options, Trainer

from .helpers import make_run, run_config, single_process_env, standard_groups, write_groups

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(400)]


def _run(root: Path, cfg) -> Trainer:
    t = Trainer(root, cfg, Options(max_idle_s=20), dist=single_process_env())
    t.setup()
    assert t.run() == 0
    return t


def test_torn_newest_checkpoint_falls_back_without_losing_commits(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = run_config(trainer={"checkpoint_every": 2, "total_steps": 4})
    paths = make_run(tmp_path / "run", cfg)
    groups = standard_groups(8)
    write_groups(paths.root, groups)
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    _run(paths.root, cfg)
    monkeypatch.setattr(os, "fsync", real_fsync)
    first = [m["tag"] for m in ckpt.lineage(paths)]
    assert first == ["step_000002-g1", "step_000004-g1"]
    torn = paths.checkpoints / "step_000004-g1"
    files = sorted(str(p.relative_to(torn)) for p in torn.rglob("*") if p.is_file())
    assert any(f.startswith("ds/") for f in files)
    for rel in files:  # every file was fsynced under the temporary name, before the rename and LATEST
        assert any("@step_000004-g1." in s and (s.endswith("/" + rel) or f"@{rel}." in s)
                   for s in synced), rel  # meta.json goes through its own temporary
    assert set(ckpt.read_meta(paths, "step_000004-g1")["files"]) == set(files) - {"meta.json"}
    assert ckpt.verify(paths, "step_000004-g1") == ""
    assert Spool(paths.root).stats()["shards_committed"] == 8
    losses = {r["step"]: r["loss"] for r in read_metrics(paths.root, "train_step")}

    biggest = max((torn / f for f in files if f.startswith("ds/")), key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as f:
        f.truncate(biggest.stat().st_size // 2)
    assert "bytes, the manifest says" in ckpt.verify(paths, "step_000004-g1")

    _run(paths.root, cfg)
    start = list(read_metrics(paths.root, "trainer_start"))[-1]
    assert start["resumed_from"] == "step_000002-g1" and start["step"] == 2
    assert [s["tag"] for s in start["skipped"]] == ["step_000004-g1"]
    assert start["recovered"]["uncommitted"] == 4  # the shards steps 3-4 had committed come back
    tags = [m["tag"] for m in ckpt.lineage(paths)]
    assert tags == ["step_000002-g1", "step_000004-g2"]
    again = [r for r in read_metrics(paths.root, "train_step")][-2:]
    assert [r["step"] for r in again] == [3, 4]
    for r in again:  # the same shards in the same order, from the same state: the same losses
        assert r["loss"] == pytest.approx(losses[r["step"]], rel=1e-6, abs=1e-7)
    ledger = [e for t in tags for e in ckpt.read_ledger(paths, t)]
    assert sorted(e["trajectory_id"] for e in ledger) == sorted(t.trajectory_id for g in groups for t in g)
    steps_of: dict[str, set[int]] = {}
    for e in ledger:
        steps_of.setdefault(e["task_id"], set()).add(e["step"])
    assert len(steps_of) == 8 and all(len(s) == 1 for s in steps_of.values())
    stats = Spool(paths.root).stats()
    assert stats["shards_committed"] == 8 and stats["shards_ready"] == stats["shards_claimed"] == 0
    # a flipped byte that keeps the size is caught by the digest
    rng = paths.checkpoints / "step_000004-g2" / "rng_rank0.pt"
    data = bytearray(rng.read_bytes())
    data[len(data) // 2] ^= 0x10
    rng.write_bytes(bytes(data))
    assert "does not match its digest" in ckpt.verify(paths, "step_000004-g2")
