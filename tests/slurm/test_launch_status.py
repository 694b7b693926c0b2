"""Launcher pieces that need no cluster: het-aware sacct parsing, the job ledger, status tolerance."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hpc.config import load_config
from hpc.launch import HetSlurmInfoWatcher, JobRecord, _append_record, _collect, read_records, roles_of
from hpc.paths import RunPaths
from hpc.render import render
from hpc.status import format_status, run_status

# sacct -o JobID,State,NodeList --parsable2 -j 13 for a 3-group het job (22.05, as measured)
SACCT_HET = """JobID|State|NodeList
13+0|RUNNING|gpu1
13+0.batch|RUNNING|gpu1
13+0.0|RUNNING|gpu1
13+1|RUNNING|gpu2
13+1.1|RUNNING|gpu2
13+2|FAILED|cpu[1-2]
20|COMPLETED|cpu1
20.batch|COMPLETED|cpu1
"""


def test_watcher_maps_het_leader_and_keeps_groups() -> None:
    info = HetSlurmInfoWatcher().read_info(SACCT_HET)
    assert info["13"]["State"] == "RUNNING"  # plain submitit would not know "13" at all
    assert info["13+2"]["State"] == "FAILED"
    assert info["20"]["State"] == "COMPLETED"  # plain jobs are still parsed by submitit
    assert "13+0.batch" not in info


def test_watcher_reads_bytes_and_empty() -> None:
    assert HetSlurmInfoWatcher().read_info(b"JobID|State|NodeList\n") == {}
    assert HetSlurmInfoWatcher().read_info(SACCT_HET.encode())["13+1"]["NodeList"] == "gpu2"


def test_collect_groups_by_component() -> None:
    rows = [("13+0", "RUNNING"), ("13+2", "PENDING"), ("13+1", "RUNNING"), ("20", "COMPLETED")]
    assert _collect(rows) == {"13": ["RUNNING", "RUNNING", "PENDING"], "20": ["COMPLETED"]}


def test_job_ledger_appends(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    for i in range(2):
        _append_record(paths, JobRecord(job_id=str(i), name="het", kind="launch", roles=["train", "infer"],
                                        script="s", submitted_at=1.0))
    assert [r.job_id for r in read_records(paths)] == ["0", "1"]


def test_roles_read_back_from_script() -> None:
    job = render(load_config(None, ["slurm.rollout.nodes=0"]), "/r")[0]
    assert roles_of(job, []) == ["train", "infer"]


def test_status_of_empty_run_dir_has_every_part(tmp_path: Path) -> None:
    status = run_status(tmp_path)
    assert status["schema"] == 1
    assert status["jobs"] == [] and status["endpoints"] == [] and status["failures"] == []
    assert status["trainer"] == {"policy_version": None, "checkpoint": None, "step": None}
    assert status["spool"] is None
    json.dumps(status)  # JSON-clean
    assert "no Slurm job recorded for this run" in format_status(status)


def test_status_reads_pieces(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path)
    for d in paths.directories():
        d.mkdir(parents=True)
    paths.policy_latest.write_text("7\n")
    paths.checkpoint_latest.write_text("step-000040\n")
    (paths.endpoints / "infer-gpu1-0.json").write_text(json.dumps(
        {"url": "http://gpu1:8000", "version": 7, "heartbeat": 12, "role": "infer"}))
    (paths.endpoints / "broken.json").write_text("{not json")
    (paths.metrics / "batch-5.jsonl").write_text(
        '{"t": 2, "kind": "step_end", "process": "batch-5", "role": "infer", "status": "1"}\n'
        '{"t": 1, "kind": "step_end", "process": "batch-5", "role": "rollout", "status": "0"}\n'
        '{"t": 3, "kind": "job_end", "process": "batch-5", "status": "1", "reason": "failed_infer"}\n{"torn')
    _append_record(paths, JobRecord(job_id="999999999", name="het", kind="launch", roles=["train", "infer"],
                                    script="s", submitted_at=time.time()))
    status = run_status(tmp_path)
    assert status["trainer"] == {"policy_version": 7, "checkpoint": "step-000040", "step": 40}
    assert [e["heartbeat"] for e in status["endpoints"]] == [12]
    assert [f["kind"] for f in status["failures"]] == ["step_end", "job_end"]
    assert status["jobs"][0]["job_id"] == "999999999"
    assert [g["role"] for g in status["jobs"][0]["groups"]] == ["train", "infer"]
    if status["spool"] is None:
        assert "spool" in status["errors"] or not paths.spool.is_dir()
    text = format_status(status)
    assert "policy version 7" in text and "failure" in text


def test_status_survives_a_broken_part(tmp_path: Path, monkeypatch: object) -> None:
    paths = RunPaths(tmp_path)
    paths.spool.mkdir(parents=True)
    os.chmod(paths.spool, 0o000)
    try:
        status = run_status(tmp_path)
    finally:
        os.chmod(paths.spool, 0o755)
    json.dumps(status)
    assert status["trainer"]["policy_version"] is None


def test_jobs_submitted_with_plain_sbatch_are_found(tmp_path: Path) -> None:
    from hpc.launch import known_jobs

    paths = RunPaths(tmp_path)
    paths.metrics.mkdir(parents=True)
    (paths.metrics / "batch-77.jsonl").write_text(
        '{"t": 5, "kind": "job_start", "process": "batch-77", "job_id": "77", "restart": 0, '
        '"roles": "train infer rollout"}\n')
    _append_record(paths, JobRecord(job_id="70", name="het", kind="launch", roles=["train"], script="s",
                                    submitted_at=1.0))
    jobs = known_jobs(paths)
    assert [(j.job_id, j.kind, j.roles) for j in jobs] == [
        ("70", "launch", ["train"]), ("77", "sbatch", ["train", "infer", "rollout"])]
