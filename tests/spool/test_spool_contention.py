"""Contention: 8 real processes claim 10,000 tasks from one spool, directly and through two
separate FUSE (bindfs) views of one directory: zero double claims, zero lost tasks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpc.config.spool import SpoolConfig
from hpc.spool import Spool
from tests.spool.spool_helpers import claim_worker, join_all, start

NUM_TASKS = 10_000
NUM_WORKERS = 8


def _race(views: list[Path], results: Path, put_via: Path) -> None:
    """Put NUM_TASKS tasks through ``put_via``; NUM_WORKERS claimers spread over ``views``."""
    config = SpoolConfig()
    added = Spool(put_via, config).put_tasks([{"task_id": f"task-{i:05d}", "i": i} for i in range(NUM_TASKS)])
    assert added == NUM_TASKS
    procs = [start(claim_worker, str(views[w % len(views)]), f"w{w}", str(results / f"w{w}.json"), config)
             for w in range(NUM_WORKERS)]
    join_all(procs, timeout_s=300)
    claims: Counter[str] = Counter()
    for w in range(NUM_WORKERS):
        report = json.loads((results / f"w{w}.json").read_text())
        assert report["not_finished"] == [], f"w{w} lost leases it still held: {report['not_finished'][:5]}"
        claims.update(report["claimed"])
    doubles = [t for t, n in claims.items() if n > 1]
    assert doubles == [], f"{len(doubles)} tasks claimed twice, e.g. {doubles[:5]}"
    assert sum(claims.values()) == NUM_TASKS
    assert set(claims) == {f"task-{i:05d}" for i in range(NUM_TASKS)}
    counts = Spool(views[0], config).stats()
    assert (counts["tasks_ready"], counts["tasks_claimed"], counts["tasks_done"]) == (0, 0, NUM_TASKS)


def test_eight_processes_ten_thousand_claims(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _race([run], tmp_path, run)


def _fuse_usable() -> str | None:
    if shutil.which("bindfs") is None:
        return "bindfs is not installed (apt-get install bindfs)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is not usable by this user (FUSE mounts need it)"
    return None


@pytest.fixture
def two_fuse_views(tmp_path: Path) -> Iterator[list[Path]]:
    reason = _fuse_usable()
    if reason:
        pytest.skip(f"component unavailable: {reason}")
    base = tmp_path / "base"
    views = [tmp_path / "view-a", tmp_path / "view-b"]
    for d in (base, *views):
        d.mkdir()
    mounted: list[Path] = []
    try:
        for view in views:
            proc = subprocess.run(["bindfs", "--no-allow-other", str(base), str(view)], capture_output=True, text=True)
            if proc.returncode != 0:
                pytest.skip(f"component unavailable: bindfs cannot mount here: {proc.stderr.strip()}")
            mounted.append(view)
        yield views
    finally:
        for view in mounted:
            subprocess.run(["fusermount", "-u", "-z", str(view)], check=False)


def test_two_fuse_views_race(two_fuse_views: list[Path], tmp_path: Path) -> None:
    # Each bindfs mount is its own FUSE filesystem with its own kernel attribute and entry caches.
    assert os.stat(two_fuse_views[0]).st_dev != os.stat(two_fuse_views[1]).st_dev
    results = tmp_path / "results"
    results.mkdir()
    _race(two_fuse_views, results, tmp_path / "base")  # the race under test is the claims
