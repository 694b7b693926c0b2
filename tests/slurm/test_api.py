"""The Python API (:mod:`hpc.cli.api`) against the real local Slurm: create, submit, wait, cancel, resume, scale.

Role commands are ``fake_python.sh`` (see conftest), following ``RUN/fake/<role>.plan``; the jobs are
submitted from this process (the API, not the CLI). The whole run with real roles, driven through the
same API, is tests/e2e/test_slurm_e2e.py. About 40 s.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from slurm_helpers import fast_config, wait_for

from hpc.cli import main as cli_main
from hpc.cli.api import Run, RunFailed
from hpc.config import to_dict
from hpc.errors import ConfigError, RunDirError

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def _plan(run: Run, role: str, plan: str) -> None:
    (run.root / "fake").mkdir(exist_ok=True)
    (run.root / "fake" / f"{role}.plan").write_text(plan + "\n")


def _create(run_dir: Path, fake_python: Path, train_plan: str) -> Run:
    config = to_dict(fast_config(fake_python, "slurm.rollout.nodes=1"))  # a plain dict, as a notebook has it
    run = Run.create(run_dir, config=config, paths_on_cluster=True)  # /nonexistent-model: fake_python runs the roles
    _plan(run, "train", train_plan)
    return run


def _cancel_left_over(run: Run) -> None:
    subprocess.run(["scancel", *[r["job_id"] for r in run.status()["jobs"]]], capture_output=True)


def test_bad_config_raises_the_cli_error_and_creates_nothing(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "never"
    with pytest.raises(ConfigError) as api_error:
        Run.create(run_dir, config={"trainer": {"lrr": 1e-5}}, overrides=["slurm.rollout.nodes=-1"])
    assert not run_dir.exists()
    assert "trainer.lrr" in str(api_error.value) and "slurm.rollout.nodes" in str(api_error.value)
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer:\n  lrr: 1.0e-5\n")
    assert cli_main(["launch", "--config", str(bad), "--run", str(run_dir), "slurm.rollout.nodes=-1"]) == 2
    assert capsys.readouterr().err.strip() == f"spoolrl launch: error: {api_error.value}"  # the same words
    with pytest.raises(ConfigError) as from_file:
        Run.create(run_dir, config=bad, overrides=["slurm.rollout.nodes=-1"])
    assert str(from_file.value) == str(api_error.value)
    assert not run_dir.exists()


def test_submit_and_wait_to_completed(run_dir: Path, fake_python: Path) -> None:
    run = _create(run_dir, fake_python, "4 0")
    submission = run.submit()
    try:
        assert submission.text == run.render() and "--job-name=spoolrl-test" in submission.text  # what was sbatched
        assert [j.job_id for j in submission.jobs] == submission.job_ids and len(submission.job_ids) == 1
        seen: list[dict[str, Any]] = []
        assert run.wait(timeout=120, poll_s=1, progress=seen.append) == "COMPLETED"
        assert submission.done() and submission.state == "COMPLETED"
        states = [g["state"] for s in seen for j in s["jobs"] for g in j["groups"]]
        assert "RUNNING" in states, states  # the progress callback saw the job run
        status = run.status()
        assert [(j["kind"], j["state"], [g["role"] for g in j["groups"]]) for j in status["jobs"]] == [
            ("launch", "COMPLETED", ["train", "infer", "rollout"])]
        assert "the train group finished" in (run.paths.logs / f"slurm-{submission.job_ids[0]}.out").read_text()
        with pytest.raises(RunDirError, match="already has submitted jobs"):
            run.submit()
        assert run.checkpoints() == []
    finally:
        _cancel_left_over(run)


def test_failed_group_raises_with_its_message(run_dir: Path, fake_python: Path) -> None:
    run = _create(run_dir, fake_python, "3 7")
    run.submit()
    try:
        with pytest.raises(RunFailed, match=r"FAILED: the train group \(het group 0\) ended with status 7"):
            run.wait(timeout=120, poll_s=1)
    finally:
        _cancel_left_over(run)


def test_cancel_then_resume_and_scale_from_python(run_dir: Path, fake_python: Path) -> None:
    run = _create(run_dir, fake_python, "600 0")
    first = run.submit()
    try:
        wait_for("the job runs", lambda: first.state == "RUNNING", 60)
        with pytest.raises(TimeoutError, match=r"job\(s\) \d+ still (PENDING|RUNNING) after 1 s"):
            first.wait(timeout=1, poll_s=0.5)
        assert run.cancel() == first.job_ids
        assert first.wait(timeout=60, poll_s=1) == "CANCELLED"

        _plan(run, "train", "8 0")  # the resumed job's trainer finishes after 8 s
        reopened = Run.open(run_dir)
        resumed = reopened.resume(["slurm.rollout.nodes=2"])
        assert resumed.kind == "resume" and resumed.changed == ["slurm.rollout.nodes"]
        wait_for("the resumed job runs", lambda: resumed.state == "RUNNING", 60)
        with pytest.raises(RunDirError, match="still has active jobs"):
            reopened.resume()
        scaled = reopened.scale(rollout_nodes=1)
        assert reopened.latest().job_ids == resumed.job_ids  # scale-out jobs are not the run's main submission
        assert reopened.wait(timeout=120, poll_s=1) == "COMPLETED"
        wait_for("the scale-out job is cancelled by the finished run", lambda: scaled.state == "CANCELLED", 30)
        status = reopened.status()
        assert [(j["kind"], j["state"].split()[0]) for j in status["jobs"]] == [
            ("launch", "CANCELLED"), ("resume", "COMPLETED"), ("scale", "CANCELLED")]
        assert [g["role"] for g in status["jobs"][1]["groups"]] == ["train", "infer", "rollout"]
    finally:
        _cancel_left_over(run)


def test_latest_is_the_last_submission_even_within_one_second(run_dir: Path, fake_python: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Two resumes of the same run within one second (the clock pinned to make it so) stay two submissions:
    ``latest`` is the second alone, and neither script overwrote the other."""
    run = _create(run_dir, fake_python, "600 0")
    monkeypatch.setattr("hpc.launch.time.strftime", lambda *_: "20261206-030000")
    first = run.submit()
    try:
        resumes = [run.resume(force=True), run.resume(force=True)]
        assert Run.open(run_dir).latest().job_ids == resumes[1].job_ids
        scripts = [Path(s.records[0].script) for s in (first, *resumes)]
        assert len(set(scripts)) == 3 and [p.read_text() for p in scripts[1:]] == [r.text for r in resumes]
        assert [j["kind"] for j in run.status()["jobs"]] == ["launch", "resume", "resume"]
    finally:
        _cancel_left_over(run)
