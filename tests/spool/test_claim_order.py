"""Shards are claimed in the order the consumer first saw them, not by the writers' wall clocks
(issue 14, item 13). Shard ids open with the writer's ``time.time()``: a writer whose clock runs a
day behind used to jump the queue for good, one a day ahead starved while others kept writing."""

from __future__ import annotations

import time
import types
from pathlib import Path

import pytest

import hpc.shard as shard_module
from hpc.spool import Spool
from tests.spool.spool_helpers import make_group


def _write(spool: Spool, worker: str, task: str, skew_s: float, monkeypatch: pytest.MonkeyPatch) -> str:
    """Publish one shard whose id carries a clock ``skew_s`` off."""
    fake = types.SimpleNamespace(time=lambda: time.time() + skew_s, monotonic=time.monotonic)
    with monkeypatch.context() as m:
        m.setattr(shard_module, "time", fake)
        w = spool.writer(worker)
        w.add_group(make_group(task, 2))
        sid = w.flush()
    assert sid is not None
    return sid


@pytest.mark.parametrize("skew_s", [-86400.0, 86400.0])
def test_a_skewed_writer_neither_jumps_the_queue_nor_starves(
        tmp_path: Path, skew_s: float, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.fence("c")
    listed_round: dict[str, int] = {}  # shard -> the claim round in which it was first ready
    claimed: list[str] = []
    produced: list[str] = []
    for rnd in range(8):
        for worker, skew in (("sane", 0.0), ("skewed", skew_s)):
            sid = _write(spool, worker, f"{worker}-{rnd}", skew, monkeypatch)
            listed_round[sid] = rnd
            produced.append(sid)
        claimed += [s.shard_id for s in spool.claim_shards("c", 1)]  # two in, one out: a queue forms
    # first come, first served as the consumer saw them: never a shard of a later round before an earlier one
    rounds = [listed_round[s] for s in claimed]
    assert rounds == sorted(rounds), rounds
    assert {s.split("-")[1].split(".")[0] for s in claimed[:4]} == {"sane", "skewed"}
    # the rest drains; every trajectory claimed exactly once
    while batch := spool.claim_shards("c", 4):
        claimed += [s.shard_id for s in batch]
    assert sorted(claimed) == sorted(produced) and len(set(claimed)) == len(claimed)
    spool.commit("c", claimed)
    stats = spool.stats()
    assert stats["trajectories_committed"] == 2 * len(produced) and stats["shards_ready"] == 0
