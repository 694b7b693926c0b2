"""Latencies of spoolrl's Slurm machinery on the local cluster (scripts/local_slurm.sh up; run as root).

Each figure is one het job (train | infer | rollout x2) whose role commands are the test payload
tests/slurm/fake_python.sh, submitted as the unprivileged CI user:

  render            rendering the het script in-process (mean of 200)
  start             sbatch -> every task of the 3 groups running
  train_fail_end    train task exits 7 -> Slurm reports the job FAILED (the batch script ends it)
  warn_requeue      time-limit warning (USR1 to the batch shell) -> requeued job's tasks running again
  cancel_seen       scancel -> submitit's done() (het-aware watcher)

Usage: python scripts/bench_slurm.py [--repeat N]   (default 1; about 1 minute)
Requeue note: a requeued job may start cred_expire+1 s later (10+1 here); Slurm 22.05 schedules het
jobs only from the backfill loop, which skips cycles without job/node changes, so the bench pokes
the scheduler (a no-op job update) once a second, as any other traffic on a real cluster would.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpc.config import RunConfig, load_config  # noqa: E402
from hpc.launch import track  # noqa: E402
from hpc.paths import RunPaths  # noqa: E402
from hpc.render import render  # noqa: E402
from hpc.rundir import create_run  # noqa: E402

SHARED = Path(os.environ.get("SPOOLRL_SLURM_ROOT", "/var/lib/spoolrl-slurm")) / "shared"
USER = os.environ.get("SPOOLRL_SLURM_USER") or os.environ.get("SPOOLRL_CI_USER") or "spoolrl-ci"


def wait(check: Callable[[], object], timeout_s: float = 120, poke: bool = False) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if check():
            return time.monotonic() - start
        if poke:
            for job in set(subprocess.run(["squeue", "-h", "-t", "PD", "-o", "%F"], capture_output=True,
                                          text=True).stdout.split()):
                subprocess.run(["scontrol", "update", f"JobId={job}", "Comment=poke"], capture_output=True)
        time.sleep(0.1)
    raise SystemExit("timed out")


def config(fake: Path) -> RunConfig:
    overrides = [f"slurm.{g}.{k}={v}" for g in ("train", "infer", "rollout")
                 for k, v in (("python", str(fake)), ("mem_gb", 0.25), ("cpus_per_task", 1), ("drain_s", 10))]
    return load_config(None, [*overrides, "slurm.rollout.nodes=2", "slurm.time_limit_min=5",
                              "model.path=/nonexistent", "slurm.job_name=spoolrl-bench"])


def new_run(cfg: RunConfig, plan: str | None = None) -> RunPaths:
    paths = create_run(SHARED / "spoolrl-bench" / f"run-{uuid.uuid4().hex[:8]}", cfg)
    (paths.root / "fake").mkdir()
    if plan:
        (paths.root / "fake" / "train.plan").write_text(plan)
    subprocess.run(["chown", "-R", USER, str(paths.root)], check=True)
    return paths


def submit(paths: RunPaths, cfg: RunConfig) -> str:
    script = paths.slurm / "bench.sbatch"
    script.write_text(render(cfg, paths.root)[0].text)
    out = subprocess.run(["runuser", "-u", USER, "--", "sbatch", "--parsable", str(script)], cwd=paths.root,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().split(";")[0]


def started(paths: RunPaths, restart: int = 0) -> bool:
    return len(list((paths.root / "fake").glob(f"*-r{restart}.env"))) == 4


def state(job_id: str) -> str:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True, text=True)
    return (out.stdout.splitlines() or [""])[0]


def one_round(cfg: RunConfig) -> dict[str, float]:
    figures = {}
    paths = new_run(cfg)
    t0 = time.monotonic()
    job_id = submit(paths, cfg)
    wait(lambda: started(paths))
    figures["start"] = time.monotonic() - t0  # sbatch included
    job = track(paths, job_id)
    subprocess.run(["scancel", "--batch", "--signal=USR1", job_id], check=True)
    figures["warn_requeue"] = wait(lambda: started(paths, 1), poke=True)
    job.cancel()
    figures["cancel_seen"] = wait(lambda: job.done(force_check=True))

    paths = new_run(cfg, plan="2 7\n")
    job_id = submit(paths, cfg)
    wait(lambda: started(paths))
    figures["train_fail_end"] = wait(lambda: state(job_id) == "FAILED") - 2.0  # the task lives 2 s
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("sbatch") is None:
        print("run as root with the local Slurm up (scripts/local_slurm.sh up)", file=sys.stderr)
        return 2
    fake = SHARED / "spoolrl-bench" / "fake_python.sh"
    fake.parent.mkdir(exist_ok=True)
    os.chmod(fake.parent, 0o1777)
    shutil.copy(REPO / "tests" / "slurm" / "fake_python.sh", fake)
    os.chmod(fake, 0o755)
    cfg = config(fake)
    t0 = time.perf_counter()
    for _ in range(200):
        render(cfg, "/shared/runs/bench")
    results: dict[str, list[float]] = {"render": [(time.perf_counter() - t0) / 200]}
    try:
        for _ in range(args.repeat):
            for key, value in one_round(cfg).items():
                results.setdefault(key, []).append(value)
    finally:
        subprocess.run(["scancel", "--name=spoolrl-bench", f"--user={USER}"], capture_output=True)
        shutil.rmtree(SHARED / "spoolrl-bench", ignore_errors=True)
    print(f"{'render':<16} {results.pop('render')[0] * 1000:8.2f} ms (mean of 200)")
    for key, values in results.items():
        print(f"{key:<16} {statistics.median(values):8.2f} s  (median of {len(values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
