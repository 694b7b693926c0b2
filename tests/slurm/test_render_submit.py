"""``spoolrl render --run NEW -o job.sbatch`` then plain ``sbatch job.sbatch``, for a run directory that does not
exist yet, on the real local Slurm as the unprivileged CI user (issue 38 item 4): the job's ``#SBATCH --output``
points into ``RUN/logs/``, which ``render`` creates (Slurm opens that file before the script runs and creates no
directory: before, the job FAILED at once with no log anywhere). Roles are ``fake_python.sh``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from slurm_helpers import as_ci_user, wait_for

from hpc.paths import RunPaths

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def _state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True)
    return (out.stdout.splitlines() or [""])[0]


def test_rendered_script_submitted_into_a_new_run_directory(run_dir: Path, fake_python: Path,
                                                              ci_python: Path) -> None:
    cfg = run_dir.parent / f"{run_dir.name}.yaml"
    cfg.write_text("model: {path: /nonexistent-model}\nslurm:\n  job_name: spoolrl-test\n  time_limit_min: 5\n"
                   + "".join(f"  {g}: {{python: '{fake_python}', mem_gb: 0.25, cpus_per_task: 1, drain_s: 10}}\n"
                             for g in ("train", "infer", "rollout")))
    script = run_dir.parent / f"{run_dir.name}.sbatch"
    assert not run_dir.exists()
    try:
        out = as_ci_user([str(ci_python), "-m", "hpc.cli", "render", "--config", str(cfg), "--run", str(run_dir),
                          "-o", str(script), "--paths-on-cluster"], cwd=str(run_dir.parent))
        assert out.returncode == 0, out.stderr
        assert f"note: created {run_dir}/logs/ for the job's Slurm output" in out.stderr
        assert "holds no run yet" in out.stderr
        submitted = as_ci_user(["sbatch", "--parsable", str(script)], cwd="/tmp")
        assert submitted.returncode == 0, submitted.stderr
        job_id = submitted.stdout.strip().split(";")[0]
        log = RunPaths(run_dir).logs / f"slurm-{job_id}.out"

        def started() -> bool:
            return log.exists() and f"job {job_id} (restart 0)" in log.read_text()

        wait_for(f"the job's log {log}", started, 90, poke_scheduler=True)
        # sacct may still say PENDING for a while after the job started (slurmdbd lags): wait for it
        wait_for("sacct shows the job RUNNING or COMPLETED", lambda: _state(job_id) in ("RUNNING", "COMPLETED"), 60)
        assert (run_dir / "fake" / "init.log").exists()  # the job ran its init step on RUN
        assert not log.read_text().count("nothing was started"), log.read_text()
    finally:
        if script.exists():
            script.unlink()
