"""hpc.records: every run-dir record round-trips through its one reader/writer, old formats still
parse, and content that is not the record raises RecordError naming the file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from hpc.errors import RecordError, RunDirError
from hpc.fsutil import TMP_PREFIX, TmpCleaner, atomic_write_json, publish_file, tmp_name
from hpc.paths import RunPaths
from hpc.records import (
    CheckpointPointer,
    EndpointRecord,
    TaskRecord,
    TrainerWaiting,
    clear_trainer_waiting,
    parse_policy_latest,
    read_checkpoint_latest,
    read_endpoint,
    read_policy_latest,
    read_trainer_waiting,
    scan_endpoints,
    trainer_waiting,
    write_checkpoint_latest,
    write_endpoint,
    write_policy_latest,
    write_trainer_waiting,
)


@pytest.fixture
def paths(tmp_path: Path) -> RunPaths:
    p = RunPaths(tmp_path / "run")
    for d in p.directories():
        d.mkdir(parents=True)
    return p


def test_policy_latest_round_trip_and_old_spelling(paths: RunPaths) -> None:
    assert read_policy_latest(paths) is None
    write_policy_latest(paths, 7)
    assert paths.policy_latest.read_text() == "7\n"
    assert read_policy_latest(paths) == 7
    assert parse_policy_latest("v000012\n") == 12


@pytest.mark.parametrize("text", ["", "seven", "-1", "7.5", '{"version": 7}'])
def test_policy_latest_bad_content_names_the_file(paths: RunPaths, text: str) -> None:
    paths.policy_latest.write_text(text)
    with pytest.raises(RecordError, match="policy/LATEST.*not a policy version") as info:
        read_policy_latest(paths)
    assert isinstance(info.value, RunDirError)


def test_checkpoint_latest_round_trip(paths: RunPaths) -> None:
    assert read_checkpoint_latest(paths) is None
    write_checkpoint_latest(paths, CheckpointPointer("step_000007-g2", 7, 2))
    assert paths.checkpoint_latest.read_text() == '{"generation": 2, "step": 7, "tag": "step_000007-g2"}\n'
    assert read_checkpoint_latest(paths) == CheckpointPointer("step_000007-g2", 7, 2)
    write_checkpoint_latest(paths, CheckpointPointer("step_000009"))
    assert json.loads(paths.checkpoint_latest.read_text()) == {"generation": None, "step": None, "tag": "step_000009"}


@pytest.mark.parametrize(("text", "pointer"), [("step_000005-g1\n", CheckpointPointer("step_000005-g1", 5)),
                                               ("step-000040", CheckpointPointer("step-000040", 40)),
                                               ("runs/step_000003", CheckpointPointer("runs/step_000003", 3)),
                                               ("latest", CheckpointPointer("latest"))])
def test_checkpoint_latest_bare_tag_of_older_runs(text: str, pointer: CheckpointPointer) -> None:
    assert CheckpointPointer.from_text(text) == pointer


@pytest.mark.parametrize("text", ["", "two words", "{not json", '{"step": 3}', '{"tag": ""}', "[1]",
                                  '{"tag": "step_000001", "step": "one"}', '{"tag": "t", "generation": true}'])
def test_checkpoint_latest_bad_content(text: str) -> None:
    with pytest.raises(RecordError, match="checkpoints/LATEST"):
        CheckpointPointer.from_text(text)


INFER = {"url": "http://gpu1:8000", "version": 7, "heartbeat": 12, "role": "infer", "engine": "vllm",
         "host": "gpu1", "index": 0, "pid": 4242, "model": "policy", "server_pid": 4343, "loading": None}


@pytest.mark.parametrize("data", [INFER,
                                  {"role": "loading", "loading": 3, "host": "gpu1", "index": 1, "pid": 5},
                                  {"url": "http://h:1", "heartbeat": 1, "role": "infer", "source": "rollout-server"},
                                  {"role": "rollout", "worker_id": "w/1", "host": "cpu3", "pid": 9},
                                  {"url": "http://h:2", "token_file": None, "host": "h", "pid": 3}])
def test_endpoint_record_round_trips_every_writer_format(tmp_path: Path, data: dict[str, object]) -> None:
    rec = EndpointRecord.from_json(data)
    assert rec.to_json() == data
    write_endpoint(tmp_path / "e.json", rec)
    assert json.loads((tmp_path / "e.json").read_text()) == data
    assert read_endpoint(tmp_path / "e.json") == rec


def test_endpoint_record_typed_fields() -> None:
    rec = EndpointRecord.from_json(INFER)
    assert (rec.role, rec.url, rec.version, rec.heartbeat, rec.loading, rec.host, rec.pid) == \
        ("infer", "http://gpu1:8000", 7, 12, None, "gpu1", 4242)
    assert rec.extra == {"engine": "vllm", "index": 0, "model": "policy", "server_pid": 4343}


@pytest.mark.parametrize("data", [[1], "x", {"url": 5}, {"heartbeat": "12"}, {"version": 1.5}, {"pid": True}])
def test_endpoint_record_bad_content(data: object) -> None:
    with pytest.raises(RecordError, match="infer-a.json"):
        EndpointRecord.from_json(data, "endpoints/infer-a.json")


def test_scan_endpoints_skips_half_written_and_foreign_files(tmp_path: Path) -> None:
    assert scan_endpoints(tmp_path / "missing") == []
    write_endpoint(tmp_path / "infer-a.json", EndpointRecord(role="infer", url="http://a", heartbeat=1))
    (tmp_path / "infer-b.json").write_text('{"url": "http://b", "hea')  # being written by hand
    (tmp_path / "infer-c.json").write_text('{"url": ["not", "a", "url"]}')
    (tmp_path / "loading-a.json").write_text('{"role": "loading", "loading": 2}')
    assert [p.name for p, _ in scan_endpoints(tmp_path, "infer-*.json")] == ["infer-a.json"]
    assert [r.loading for _, r in scan_endpoints(tmp_path)] == [None, 2]
    assert read_endpoint(tmp_path / "gone.json") is None


FEEDER = {"task_id": "django-1@e0", "instance_id": "django-1", "epoch": 0, "position": 3, "group_size": 4,
          "policy_version": 2}


def test_task_record_round_trip_and_task_version() -> None:
    rec = TaskRecord.from_json(FEEDER)
    assert rec.to_json() == FEEDER
    assert (rec.task_version, rec.group_size, rec.instance_id) == (2, 4, "django-1")
    service = {"task_id": "job:0", "group_size": 1, "service": {"job_id": "job"}, "sampling_params": {},
               "instance": {"instance_id": "x", "patch": "p"}}
    rec = TaskRecord.from_json(service)
    assert rec.to_json() == service and rec.task_version == -1 and rec.fields["instance"]["patch"] == "p"


@pytest.mark.parametrize("data", [[1], {}, {"task_id": ""}, {"task_id": "t", "group_size": "4"},
                                  {"task_id": "t", "policy_version": 1.0}, {"task_id": "t", "instance_id": 3}])
def test_task_record_bad_content(data: object) -> None:
    with pytest.raises(RecordError, match="spool task"):
        TaskRecord.from_json(data)


def test_trainer_waiting_round_trip_and_clear(paths: RunPaths) -> None:
    assert not trainer_waiting(paths) and read_trainer_waiting(paths) is None
    record = TrainerWaiting(step=8, policy_version=7, generation=2, since=1.5)
    write_trainer_waiting(paths, record)
    assert paths.trainer_waiting == paths.control / "TRAINER_WAITING"
    assert trainer_waiting(paths) and read_trainer_waiting(paths) == record
    assert json.loads(paths.trainer_waiting.read_text()) == {"generation": 2, "policy_version": 7, "since": 1.5,
                                                             "step": 8}
    clear_trainer_waiting(paths)
    clear_trainer_waiting(paths)  # gone already: fine
    assert not trainer_waiting(paths) and read_trainer_waiting(paths) is None


@pytest.mark.parametrize("text", ["", "[1]", '{"step": 1, "policy_version": 0, "since": 1.0}',
                                  '{"step": "1", "policy_version": 0, "generation": 1, "since": 1.0}',
                                  '{"step": 1, "policy_version": 0, "generation": 1, "since": "now"}'])
def test_trainer_waiting_bad_content_names_the_file(paths: RunPaths, text: str) -> None:
    paths.trainer_waiting.write_text(text)
    with pytest.raises(RecordError, match="TRAINER_WAITING"):
        read_trainer_waiting(paths)


def test_model_path_resolution(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    assert paths.model_dir("tiny") == tmp_path / "model"
    assert paths.model_dir("/models/qwen") == Path("/models/qwen")
    assert paths.tokenizer_dir("tiny") == tmp_path / "model"
    assert paths.tokenizer_dir("/models/qwen", "/tok") == Path("/tok")


def test_one_temporary_name_for_every_atomic_write(tmp_path: Path) -> None:
    name = tmp_name(tmp_path / "infer-a.json").name
    assert name.startswith(f"{TMP_PREFIX}{os.getpid()}@") and not name.endswith(".json")
    assert tmp_name(tmp_path / "x", "shard-1").name.endswith("@shard-1")
    atomic_write_json(tmp_path / "a.json", {"a": 1})
    assert publish_file(tmp_path / "b", b"1") and not publish_file(tmp_path / "b", b"2")
    assert (tmp_path / "b").read_bytes() == b"1"
    assert sorted(os.listdir(tmp_path)) == ["a.json", "b"]  # no temporary left behind


def test_cleaner_removes_a_dead_writers_atomic_write_temporary(tmp_path: Path) -> None:
    dead = tmp_name(tmp_path / "a.json").name.replace(f"@{os.getpid()}@", "@999999999@", 1)
    (tmp_path / dead).write_text("{")
    assert TmpCleaner(60.0).clean(tmp_path, os.listdir(tmp_path)) == 1
    assert os.listdir(tmp_path) == []


def test_status_shows_a_hand_edited_latest_instead_of_failing(paths: RunPaths) -> None:
    from hpc.status import trainer_part

    paths.policy_latest.write_text("seven\n")
    paths.checkpoint_latest.write_text('{"step": 3}\n')
    assert trainer_part(paths) == {"policy_version": None, "checkpoint": '{"step": 3}', "step": None}
    write_policy_latest(paths, 4)
    write_checkpoint_latest(paths, CheckpointPointer("step_000003-g1", 3, 1))
    assert trainer_part(paths) == {"policy_version": 4, "checkpoint": "step_000003-g1", "step": 3}


HAND_PARSERS = ("policy_latest.read_text", "checkpoint_latest.read_text", '== "tiny"', '!= "tiny"', "tmp_sibling")


def test_nobody_parses_a_run_dir_record_by_hand() -> None:
    root = Path(__file__).resolve().parents[2]
    found = [f"{path.relative_to(root)}: {pattern}" for top in ("hpc", "rollout_node", "train_node", "scripts")
             for path in sorted((root / top).rglob("*.py")) if path.name != "records.py"
             for pattern in HAND_PARSERS if pattern in path.read_text()]
    assert found == [], "read and write these through hpc.records / RunPaths.model_dir / hpc.fsutil"
