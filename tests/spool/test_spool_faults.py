"""Faults: corrupt and truncated shards, a full disk (real 1 MiB tmpfs), an injected quota error,
a writer killed mid-shard; plus polling, metrics and the spool CLI."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import hpc.arrival as arrival_module
from hpc.cli import main as cli_main
from hpc.config.spool import SpoolConfig
from hpc.errors import CorruptShardError, SpoolError
from hpc.metrics import MetricsWriter, read_metrics
from hpc.shard import (
    FORMAT_VERSION,
    HEADER,
    MAGIC,
    SHA256_FORMAT,
    SUFFIX,
    _digest,
    decode_table,
    encode_rows,
    encode_shard,
    table_trajectories,
)
from hpc.spool import Spool
from tests.spool.spool_helpers import CTX, make_group, make_traj, start, wait_for_shards


def _three_shards(spool: Spool) -> list[Path]:
    with spool.writer("w") as writer:
        for i in range(3):
            writer.add_group(make_group(f"t{i}", 2))
            writer.flush()
    return sorted(spool.ready.glob(f"*{SUFFIX}"))


def test_corrupt_and_truncated_shards_are_quarantined(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    flipped, truncated, good = _three_shards(spool)
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-100])
    (spool.ready / f"9999999999999-garbage-n3{SUFFIX}").write_bytes(b"not a shard at all " * 10)
    spool.fence("c")
    shards = spool.claim_shards("c", 10)  # never raises: bad shards are set aside
    assert [s.shard_id + SUFFIX for s in shards] == [good.name]
    assert len(list(shards[0].trajectories())) == 2
    reasons = {p.name: json.loads(p.read_text())["reason"] for p in spool.quarantine.glob("*.reason.json")}
    assert any("checksum mismatch" in r for r in reasons.values())
    assert any("truncated" in r for r in reasons.values())
    assert any("not a spoolrl shard" in r for r in reasons.values())
    stats = spool.stats()
    assert stats["shards_quarantined"] == 3 and stats["corrupt_detected_here"] == 3
    assert stats["trajectories_quarantined"] == 2 + 2 + 3  # from the shard ids


def test_format1_sha256_shards_stay_readable_and_checked(tmp_path: Path) -> None:
    """Shards sealed before XXH3 (format 1, sha256 digest) decode; a flipped byte is still caught."""
    header, body = encode_shard(make_group("old", 3), "old-writer")
    raw = memoryview(body).tobytes()
    old = HEADER.pack(MAGIC, SHA256_FORMAT, HEADER.size, 0, len(raw), hashlib.sha256(raw).digest())
    assert len(list(table_trajectories(decode_table(old + raw, "v1"), "v1"))) == 3
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 1
    with pytest.raises(CorruptShardError, match="checksum mismatch"):
        decode_table(old + bytes(flipped), "v1")
    newer = HEADER.pack(MAGIC, FORMAT_VERSION + 1, HEADER.size, 0, len(raw), b"\0" * 32)
    with pytest.raises(CorruptShardError, match="newer than this spoolrl"):
        decode_table(newer + raw, "v3")
    assert decode_table(header + raw, "v2").num_rows == 3


def _row1_value(name: str, pos: int, value: float) -> Callable[[dict[str, pa.Array]], None]:
    """A mutation of one token of row 1 (rows are 32 tokens: 8 prompt, 24 generated)."""
    def mutate(cols: dict[str, pa.Array]) -> None:
        col = cols[name]
        values = col.values.to_numpy(zero_copy_only=False).copy()
        values[32 + pos] = value
        cols[name] = pa.ListArray.from_arrays(col.offsets, pa.array(values, type=col.type.value_type))
    return mutate


def _row1_scalar(name: str, value: object) -> Callable[[dict[str, pa.Array]], None]:
    def mutate(cols: dict[str, pa.Array]) -> None:
        values = cols[name].to_pylist()
        values[1] = value
        cols[name] = pa.array(values, type=cols[name].type)
    return mutate


def _shorter_row1(cols: dict[str, pa.Array]) -> None:
    col = cols["logprobs"]
    cols["logprobs"] = pa.ListArray.from_arrays(pa.array([0, 32, 63, 96], pa.int32()), col.values)


BAD_ROWS = {
    "loss_mask values must be 0 or 1": _row1_value("loss_mask", 10, 2),
    "token IDs must be >= 0": _row1_value("token_ids", 3, -1),
    "logprobs must be 0 where loss_mask is 0": _row1_value("logprobs", 2, -0.5),
    "finite and <= 0": _row1_value("logprobs", 20, 0.5),
    "finite and <= 0 (nan)": _row1_value("logprobs", 20, float("nan")),
    "policy_versions": _row1_value("policy_versions", 2, 5),
    "differ in length": _shorter_row1,
    "unknown status": _row1_scalar("status", "bogus"),
    "reward must be finite": _row1_scalar("reward", float("inf")),
    "task_id must be non-empty": _row1_scalar("task_id", ""),
    "attempt must be >= 0": _row1_scalar("attempt", -1),
}


@pytest.mark.parametrize("rule", list(BAD_ROWS))
def test_a_checksummed_shard_with_a_rule_breaking_row_is_quarantined(tmp_path: Path, rule: str) -> None:
    """Rows are checked column-wise when a shard is decoded (not one by one when records are built):
    a shard whose bytes are intact but whose row 1 breaks a Trajectory rule is set aside at claim
    time with the row and the rule, and the consumer goes on."""
    batch = encode_rows(make_group("t", 3))
    cols = {name: batch.column(name) for name in batch.schema.names}
    BAD_ROWS[rule](cols)
    body = pa.BufferOutputStream()
    with pa.ipc.new_stream(body, batch.schema) as stream:
        stream.write_batch(pa.RecordBatch.from_arrays([cols[n] for n in batch.schema.names], schema=batch.schema))
    data = body.getvalue().to_pybytes()
    header = HEADER.pack(MAGIC, FORMAT_VERSION, HEADER.size, 0, len(data), _digest(data))
    spool = Spool(tmp_path)
    (spool.ready / f"0000000000001-bad-00001-n3{SUFFIX}").write_bytes(header + data)
    spool.fence("c")
    assert spool.claim_shards("c", 4) == []
    (reason,) = [json.loads(p.read_text())["reason"] for p in spool.quarantine.glob("*.reason.json")]
    assert "row 1 is not a valid trajectory" in reason and rule.split(" (")[0] in reason, reason


def test_reused_encoder_buffers_never_leak_into_a_published_shard(tmp_path: Path) -> None:
    """The writer encodes every shard into the same buffers: shards of shrinking and growing size,
    written back to back, each decode to exactly their own trajectories."""
    spool = Spool(tmp_path)
    sizes = [6, 2, 9, 1, 4]
    with spool.writer("w") as writer:
        for i, n in enumerate(sizes):
            writer.add_group([make_traj(f"t{i}", k, n_tokens=500 * (i + 1) - 37 * k) for k in range(n)])
            writer.flush()
    spool.fence("c")
    got = {t.trajectory_id: t for s in spool.claim_shards("c", 10) for t in s.trajectories()}
    assert len(got) == sum(sizes)
    for i, n in enumerate(sizes):
        for k in range(n):
            want = make_traj(f"t{i}", k, n_tokens=500 * (i + 1) - 37 * k)
            have = got[want.trajectory_id]
            for name in ("token_ids", "loss_mask", "logprobs", "policy_versions"):
                assert np.array_equal(getattr(have, name), getattr(want, name)), (want.trajectory_id, name)


def test_injected_quota_error_is_clear_and_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    writer = spool.writer("w")
    writer.add_group(make_group("t", 3))

    def over_quota(fd: int) -> None:
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "fsync", over_quota)
    with pytest.raises(SpoolError, match="EDQUOT") as info:
        writer.flush()
    assert str(spool.ready) in str(info.value) and "quota" in str(info.value)
    assert os.listdir(spool.ready) == []  # no shard, no temporary
    monkeypatch.undo()
    assert writer.pending() == 3  # kept: the flush can be retried once there is room
    writer.close()
    assert spool.stats()["trajectories_ready"] == 3


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "full"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"component unavailable: cannot mount a 1 MiB tmpfs (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_gives_clear_error_and_no_partial_shard(tiny_tmpfs: Path) -> None:
    spool = Spool(tiny_tmpfs, SpoolConfig(shard_max_trajectories=1000, shard_max_mb=64))
    writer = spool.writer("w")
    for i in range(8):  # 8 x 4 x ~53 kB = ~1.7 MB > 1 MiB
        writer.add_group(make_group(f"t{i}", 4, n_tokens=4096))
    with pytest.raises(SpoolError, match="ENOSPC") as info:
        writer.flush()
    assert str(spool.ready) in str(info.value) and "free space" in str(info.value)
    assert os.listdir(spool.ready) == []
    assert spool.stats()["shards_ready"] == 0
    with pytest.raises(SpoolError, match="ENOSPC"):  # tasks too: a clear error, not a traceback
        spool.put_tasks([{"task_id": f"task-{i}", "pad": "x" * 2000} for i in range(600)])
    assert [n for n in os.listdir(spool.tasks.ready) if n.startswith(".tmp")] == []


def _die_while_publishing(run: str) -> None:
    def killed(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    spool = Spool(run)
    writer = spool.writer("doomed")
    writer.add_group(make_group("t", 3))
    os.rename = killed  # type: ignore[assignment]  # dies between the fsync and the rename
    writer.flush()


def test_writer_killed_mid_shard_leaves_only_a_cleaned_temporary(tmp_path: Path) -> None:
    proc = start(_die_while_publishing, str(tmp_path))
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    spool = Spool(tmp_path)
    names = os.listdir(spool.ready)
    assert len(names) == 1 and names[0].startswith(".tmp@") and not names[0].endswith(SUFFIX)
    assert spool.stats()["tmp_files"] == 1 and spool.stats()["shards_ready"] == 0
    assert spool.claim_shards("c", 10) == []  # listing ready/ also removes temporaries of dead writers
    assert os.listdir(spool.ready) == []


def _write_later(run: str) -> None:
    time.sleep(0.5)
    with Spool(run).writer("late") as writer:
        writer.add_group(make_group("t", 2))


def test_wait_for_shards_sees_a_shard_from_another_process(tmp_path: Path) -> None:
    spool = Spool(tmp_path, SpoolConfig(poll_interval_s=0.2))
    assert wait_for_shards(spool, "c", 4, timeout_s=0.3) == []
    proc = CTX.Process(target=_write_later, args=(str(tmp_path),))
    proc.start()
    shards = wait_for_shards(spool, "c", 4, timeout_s=30)
    proc.join()
    assert [len(s) for s in shards] == [2]


def test_metrics_jsonl_schema_and_torn_line(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path, "rollout-0") as m:
        m.log("episode", reward=1.0, tokens=12)
        with pytest.raises(ValueError, match="reserved"):
            m.log("bad", t=3)
    with MetricsWriter(tmp_path, "trainer") as m:
        m.log("train_step", step=1, loss=0.5)
    with open(tmp_path / "metrics" / "trainer.jsonl", "a") as f:
        f.write('{"t": 1, "kind": "torn')  # a crash mid-line
    records = list(read_metrics(tmp_path))
    assert {(r["process"], r["kind"]) for r in records} == {("rollout-0", "episode"), ("trainer", "train_step")}
    assert all(isinstance(r["t"], float) for r in records)
    assert [r["step"] for r in read_metrics(tmp_path, kind="train_step")] == [1]


def test_cli_stats_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spool = Spool(tmp_path)
    spool.put_tasks([{"task_id": "a"}])
    with spool.writer("w") as writer:
        writer.add_group([make_traj("a", 0), make_traj("a", 1)])
    assert cli_main(["spool", "stats", str(tmp_path), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["tasks_ready"] == 1 and stats["trajectories_ready"] == 2
    assert cli_main(["spool", "stats", str(tmp_path)]) == 0
    assert "shards_ready" in capsys.readouterr().out
    (shard,) = spool.ready.glob(f"*{SUFFIX}")
    assert cli_main(["spool", "inspect", str(shard), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["trajectory_id"] for r in lines] == ["a/0/0", "a/1/0"]
    assert lines[0]["token_ids"] == make_traj("a", 0).token_ids.tolist()
    assert cli_main(["spool", "inspect", str(tmp_path / "missing.shard")]) == 2
    assert "no such shard file" in capsys.readouterr().err
    assert cli_main(["spool", "stats", str(tmp_path / "nope")]) == 2


def test_polling_never_loses_a_shard_hidden_behind_a_coarse_timestamp(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    frozen = os.stat(spool.ready)  # a filesystem whose directory attributes did not move
    real_stat = os.stat
    monkeypatch.setattr(arrival_module.os, "stat",
                        lambda p, *a, **k: frozen if Path(p) == spool.ready else real_stat(p, *a, **k))
    monkeypatch.setattr(arrival_module, "SETTLE_S", 0.3)
    assert spool.claim_shards("c", 4, if_changed=True) == []  # first sight: lists
    with spool.writer("w") as writer:
        writer.add_group(make_group("t", 2))
    assert spool.claim_shards("c", 4, if_changed=True) == []  # same attributes: only a stat
    time.sleep(0.4)
    assert [len(s) for s in spool.claim_shards("c", 4, if_changed=True)] == [2]  # the settle listing
