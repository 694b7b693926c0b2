"""``spoolrl tasks check --slurm`` on the real local Slurm: a submitit job array of chunks, one killed.

Six of the built-in instances in 3 chunks (array tasks N_0..N_2, real bwrap sandboxes on the cpu
nodes); the first chunk is scancelled while it runs and must be retried; the gathered JSONL must be
the local check's rows (timings aside). About 30 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import typing as tp
import uuid
from pathlib import Path

import pytest
from slurm_helpers import SHARED, wait_for

if tp.TYPE_CHECKING:
    from rollout_node.tasks.instance import TaskInstance

pytestmark = [pytest.mark.slurm, pytest.mark.sandbox, pytest.mark.timeout(300)]

TIMINGS = ("gold_s", "empty_s")
# Array task 0 holds in its setup line until the test cancels it: a chunk of 2 instances checks in ~2 s, so
# without the hold it could finish between squeue showing it RUNNING and scancel (seen once in CI). The retry
# is a plain job (no SLURM_ARRAY_TASK_ID) and the other chunks have other ids, so only the first attempt waits.
HOLD_FIRST_CHUNK = 'if [ "${SLURM_ARRAY_TASK_ID:-}" = 0 ]; then sleep 120; fi'


def _rows(stdout: str) -> list[dict[str, object]]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in stdout.splitlines()]


def _instances() -> list[str]:
    from rollout_node.tasks.instance import load_tasks

    ids = [t.instance_id for t in load_tasks("builtin")]
    return ids[:4] + ids[-2:]  # two repositories' worth, six instances


def _squeue(query: list[str]) -> list[str]:
    out = subprocess.run(["squeue", "-h", *query], capture_output=True, text=True, timeout=30)
    return out.stdout.split()


def test_slurm_array_matches_local_and_retries_a_killed_chunk(slurm: None, tmp_path: Path) -> None:
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    name = f"spoolrl-tc-{uuid.uuid4().hex[:6]}"
    folder = SHARED / "spoolrl-tests" / name
    picks = [a for i in _instances() for a in ("--instance", i)]
    spoolrl = [sys.executable, "-m", "hpc.cli", "tasks", "check", "builtin", f"slurm.job_name={name}",
               "slurm.rollout.mem_gb=0.5",  # the retry need not wait for a node's memory
               f"slurm.rollout.setup=['{HOLD_FIRST_CHUNK}']"]
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path(__file__).resolve().parents[2]))}
    fanned = subprocess.Popen([*spoolrl, *picks, "--slurm", "--chunks", "3", "--array-parallelism", "3",
                               "--slurm-dir", str(folder), "--jobs", "1"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    retry_states: list[str] = []
    try:
        # kill the first chunk while it runs: wait until Slurm shows its array task RUNNING
        job_name = f"{name}-tasks-check"
        first = wait_for("chunk 0 running", lambda: [j for j in _squeue(["-n", job_name, "-t", "R", "-o", "%i"])
                                                     if j.endswith("_0")], 90)
        assert isinstance(first, list)
        killed = first[0]
        subprocess.run(["scancel", killed], check=True, timeout=30)
        killed_at = time.monotonic()
        local = subprocess.run([*spoolrl, *picks, "--jobs", "2"], capture_output=True, text=True, env=env,
                               timeout=240)
        out, err = fanned.communicate(timeout=240)
        took_s = time.monotonic() - killed_at
        if "retrying it once as job " in err:
            # submitit returns once the retry has written its result; the job ends a moment later (CI saw it
            # RUNNING in sacct right after the rows came back): wait for it before the cleanup below cancels
            # whatever still runs under the name.
            retry = err.split("retrying it once as job ")[1].split()[0]

            def ended() -> list[str]:
                states = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", retry],
                                        capture_output=True, text=True, timeout=30).stdout.split()
                return states if states and states[0] not in ("PENDING", "RUNNING", "COMPLETING") else []

            retry_states = tp.cast(list[str], wait_for(f"the retry job {retry} to end", ended, 60))
    finally:
        if fanned.poll() is None:
            fanned.kill()
        subprocess.run(["scancel", f"--name={name}-tasks-check", "--quiet"], capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    assert local.returncode == 0, local.stderr
    assert fanned.returncode == 0, err
    assert _rows(out) == _rows(local.stdout) and len(_rows(out)) == 6  # same rows, same order
    assert f"chunk-0 (2 instances) failed (job {killed} CANCELLED" in err and "retrying it once" in err, err
    assert "6/6 instances ok" in err
    arrays = [line.split("job array ")[1].split()[0] for line in err.splitlines() if "job array" in line]
    assert arrays == [killed.split("_")[0]], err
    assert retry_states == ["COMPLETED"], retry_states  # the retry ran as its own job and gave the rows
    assert took_s < 240


def _tasks(n: int) -> list[TaskInstance]:
    """``n`` distinct instances (split_chunks looks only at their order)."""
    from rollout_node.tasks.instance import TaskInstance

    return [TaskInstance(instance_id=f"t{i}", repo="r", base_commit="c", patch="", test_patch="", FAIL_TO_PASS=(),
                         PASS_TO_PASS=()) for i in range(n)]


def test_chunks_are_contiguous_nearly_equal_and_named() -> None:
    from hpc.cli.tasks_slurm import split_chunks
    from hpc.errors import UsageError

    tasks = _tasks(10)
    chunks = split_chunks(tasks, 4)
    assert [c.name for c in chunks] == ["chunk-0", "chunk-1", "chunk-2", "chunk-3"]
    assert {len(c.tasks) for c in chunks} == {2, 3} and [t for c in chunks for t in c.tasks] == tasks
    assert [c.name for c in split_chunks(tasks, 12)][-1] == "chunk-9"  # never more chunks than instances
    assert split_chunks(_tasks(20), 11)[10].name == "chunk-10" and split_chunks(tasks, 11)[0].name == "chunk-0"
    with pytest.raises(UsageError, match="--chunks"):
        split_chunks(tasks, 0)
