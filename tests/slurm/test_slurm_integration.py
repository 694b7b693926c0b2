"""The rendered het job on the real local Slurm, submitted as the unprivileged CI user.

Role commands are ``fake_python.sh`` (see conftest): each task records its environment and the
signals it gets, and follows ``RUN/fake/<role>.plan``. About 2-3 minutes in all.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from slurm_helpers import CI_USER, as_ci_user, chown_to_ci, fast_config, make_run, wait_for

from hpc.config import RunConfig
from hpc.launch import HetSlurmJob, track
from hpc.paths import RunPaths
from hpc.render import render
from hpc.slurm_env import SlurmEnv

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(240)]


def _submit(paths: RunPaths, config: RunConfig) -> HetSlurmJob:
    script = paths.slurm / "test.sbatch"
    script.write_text(render(config, paths.root)[0].text)
    chown_to_ci(paths.slurm)
    out = as_ci_user(["sbatch", "--parsable", str(script)], cwd=str(paths.root))
    assert out.returncode == 0, out.stderr
    return track(paths, out.stdout.strip().split(";")[0])


def _envs(paths: RunPaths, restart: int = 0) -> dict[str, dict[str, str]]:
    """tag (role-node-procid) -> environment of each fake task started in that restart."""
    out = {}
    for f in (paths.root / "fake").glob(f"*-r{restart}.env"):
        env = dict(line.split("=", 1) for line in f.read_text().splitlines() if "=" in line)
        out[f.name.removesuffix(f"-r{restart}.env")] = env
    return out


def _all_started(paths: RunPaths, restart: int = 0) -> dict[str, dict[str, str]] | None:
    envs = _envs(paths, restart)
    return envs if len(envs) == 4 else None


def _signals(paths: RunPaths, role: str) -> list[str]:
    return [line for f in (paths.root / "fake").glob(f"{role}-*.signals") for line in f.read_text().split()]


def _batch_log(paths: RunPaths, job: HetSlurmJob) -> str:
    log = paths.logs / f"slurm-{job.job_id}.out"
    return log.read_text() if log.exists() else ""


def _sacct_state(job_id: str) -> str:
    """State of a plain job, or of a het job's group 0 (sacct -X lists N+0 first)."""
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id], capture_output=True,
                         text=True).stdout.splitlines()
    return out[0] if out else ""


def test_groups_placement_logs_and_submitit_tracking(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python)
    paths = make_run(run_dir, config)
    job = _submit(paths, config)
    envs = wait_for("all 4 tasks started", lambda: _all_started(paths), 60)
    assert isinstance(envs, dict)
    by_role: dict[str, list[SlurmEnv]] = {}
    for tag, env in envs.items():
        by_role.setdefault(tag.split("-")[0], []).append(SlurmEnv.from_environ(env))
        assert env["SPOOLRL_RUN"] == str(paths.root)
    assert sorted(by_role) == ["infer", "rollout", "train"]
    for group, role in enumerate(("train", "infer", "rollout")):
        for s in by_role[role]:
            assert s.het_group == group and s.job_id == job.job_id and s.num_het_groups == 3
    assert {s.node_name for s in by_role["rollout"]} == {"cpu1", "cpu2"}
    assert sorted(s.group_rank for s in by_role["rollout"]) == [0, 1]
    assert {s.node_name for s in by_role["train"] + by_role["infer"]} == {"gpu1", "gpu2"}
    train_env = next(iter(envs[t] for t in envs if t.startswith("train")))
    assert train_env.get("CUDA_VISIBLE_DEVICES") in ("0", "1")  # one fake GPU reached the train step
    assert by_role["train"][0].rendezvous(0)[0] in ("gpu1", "gpu2")
    left = by_role["rollout"][0].remaining_s()  # 22.05 exports no SLURM_JOB_END_TIME: squeue answers
    assert left is not None and 200 < left <= 300
    init = (paths.root / "fake" / "init.log").read_text()
    # the job's first step freezes (or checks) RUN from the config embedded in the script, by digest
    assert f"init {paths.root} --if-missing --expect-digest sha256:" in init and "--config /dev/stdin" in init
    for role in ("train", "infer", "rollout"):
        assert list((paths.logs / role).glob(f"{job.job_id}-r0-*.log")), f"no {role} log"
    assert "started the rollout step" in _batch_log(paths, job)

    wait_for("submitit sees RUNNING", lambda: job.watcher.get_state(job.job_id, mode="force") == "RUNNING", 30)
    assert job.group_states(3) == ["RUNNING"] * 3
    job.cancel()  # as root; the job belongs to the CI user
    wait_for("submitit sees the cancel", lambda: job.done(force_check=True), 30)
    assert job.state.startswith("CANCELLED")


def test_train_failure_ends_job_naming_the_group(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python)
    paths = make_run(run_dir, config)
    (paths.root / "fake" / "train.plan").write_text("3 7\n")
    chown_to_ci(paths.root / "fake")
    job = _submit(paths, config)
    wait_for("all tasks started", lambda: _all_started(paths), 60)
    failed_at = time.monotonic() + 3
    wait_for("the job ends", lambda: job.done(force_check=True), 70)
    assert time.monotonic() - failed_at < 60
    log = _batch_log(paths, job)
    assert "the train group (het group 0) ended with status 7; ending the job" in log
    assert _sacct_state(job.job_id) == "FAILED"
    assert _signals(paths, "infer") == ["TERM"]  # the others were asked to stop, not killed
    events = [json.loads(line) for line in (paths.metrics / f"batch-{job.job_id}.jsonl").read_text().splitlines()]
    assert events[-1]["kind"] == "job_end" and events[-1]["reason"] == "failed_train"


def test_rollout_failure_does_not_end_job(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python, "slurm.max_rollout_restarts=1")
    paths = make_run(run_dir, config)
    (paths.root / "fake" / "rollout.plan").write_text("1 9\n")
    chown_to_ci(paths.root / "fake")
    job = _submit(paths, config)
    wait_for("rollout restarts run out", lambda: "no restarts left" in _batch_log(paths, job), 60)
    log = _batch_log(paths, job)
    assert "the rollout step ended (status 9); restart 1/1" in log
    time.sleep(2)
    assert job.watcher.get_state(job.job_id, mode="force") == "RUNNING"
    assert "job ends" not in _batch_log(paths, job)
    job.cancel()
    wait_for("cancelled", lambda: job.done(force_check=True), 30)


def test_requeue_after_warning_signal(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python)
    paths = make_run(run_dir, config)
    job = _submit(paths, config)
    wait_for("all tasks started", lambda: _all_started(paths), 60)
    job._interrupt(timeout=True)  # what Slurm's --signal=B:USR1@T does at the time limit
    wait_for("train drained on USR1", lambda: "USR1" in _signals(paths, "train"), 30)
    wait_for("requeued job restarted", lambda: _all_started(paths, restart=1), 90, poke_scheduler=True)
    assert "requeued job" in _batch_log(paths, job)
    restarted = SlurmEnv.from_environ(next(iter(_envs(paths, 1).values())))
    assert restarted.restart_count == 1 and restarted.job_id == job.job_id
    assert len(list((paths.logs / "train").glob(f"{job.job_id}-r1-*.log"))) == 1
    job.cancel()
    wait_for("cancelled", lambda: job.done(force_check=True), 30)


def test_bare_scontrol_requeue(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python)
    paths = make_run(run_dir, config)
    job = _submit(paths, config)
    wait_for("all tasks started", lambda: _all_started(paths), 60)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True)  # SIGTERM only, as preemption does
    wait_for("steps got SIGTERM", lambda: "TERM" in _signals(paths, "train") and "TERM" in _signals(paths, "rollout"),
             30)
    wait_for("requeued job restarted", lambda: _all_started(paths, restart=1), 90, poke_scheduler=True)
    assert "SIGTERM: Slurm is stopping or requeueing" in _batch_log(paths, job)
    job.cancel()
    wait_for("cancelled", lambda: job.done(force_check=True), 30)


def test_cli_launch_status_cancel_as_unprivileged_user(run_dir: Path, fake_python: Path, ci_python: Path) -> None:
    cfg = run_dir.parent / f"{run_dir.name}.yaml"
    cfg.write_text(
        "model: {path: /nonexistent-model}\n"
        "slurm:\n  job_name: spoolrl-test\n  time_limit_min: 5\n"
        + "".join(f"  {g}: {{python: '{fake_python}', mem_gb: 0.25, cpus_per_task: 1, drain_s: 10}}\n"
                  for g in ("train", "infer", "rollout"))
    )
    cli = [str(ci_python), "-m", "hpc.cli"]
    out = as_ci_user([*cli, "launch", "--config", str(cfg), str(run_dir), "--paths-on-cluster"],
                     cwd=str(run_dir.parent))
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.split()[2]
    assert f"run: {run_dir}" in out.stdout
    paths = RunPaths(run_dir)
    assert (paths.slurm / "jobs.json").exists()

    def running() -> dict | None:
        st = as_ci_user([*cli, "status", str(run_dir), "--json"])
        assert st.returncode == 0, st.stderr
        status = json.loads(st.stdout)
        return status if status["jobs"] and status["jobs"][0]["state"] == "RUNNING" else None

    status = wait_for("status shows RUNNING", running, 60)
    assert isinstance(status, dict)
    assert [g["role"] for g in status["jobs"][0]["groups"]] == ["train", "infer", "rollout"]
    assert status["jobs"][0]["job_id"] == job_id
    again = as_ci_user([*cli, "launch", "--config", str(cfg), str(run_dir), "--paths-on-cluster"])
    assert again.returncode != 0 and "already holds a run" in again.stderr
    refused = as_ci_user([*cli, "resume", str(run_dir)])
    assert refused.returncode != 0 and "still has active jobs" in refused.stderr
    cancel = as_ci_user([*cli, "cancel", str(run_dir)])
    assert cancel.returncode == 0 and job_id in cancel.stdout
    wait_for("cancelled", lambda: _sacct_state(job_id).startswith("CANCELLED"), 30)

    def job_users() -> set[str]:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "User", "-j", job_id], capture_output=True, text=True)
        return set(out.stdout.split())

    # slurmdbd may list a job's record before it has the user (one CI run read 'root' right after the
    # cancel); every record of the job must name the unprivileged user once accounting caught up
    wait_for(f"accounting names {CI_USER} for every part of the job", lambda: job_users() == {CI_USER}, 30)

    resumed = as_ci_user([*cli, "resume", str(run_dir), "slurm.rollout.nodes=2"])
    assert resumed.returncode == 0, resumed.stderr
    assert "slurm.rollout.nodes" in resumed.stdout  # a resumable key changed, and it says so
    new_id = resumed.stdout.split("submitted job ")[1].split()[0]
    wait_for("resumed job running", lambda: _sacct_state(new_id) == "RUNNING", 60)
    final = json.loads(as_ci_user([*cli, "status", str(run_dir), "--json"]).stdout)
    assert [(j["kind"], j["state"].split()[0]) for j in final["jobs"]] == [("launch", "CANCELLED"),
                                                                           ("resume", "RUNNING")]
    unsafe = as_ci_user([*cli, "resume", str(run_dir), "--force", "trainer.lr=0.5"])
    assert unsafe.returncode != 0 and "trainer.lr" in unsafe.stderr
    assert as_ci_user([*cli, "cancel", str(run_dir)]).returncode == 0


def test_separate_mode_and_scale_as_unprivileged_user(run_dir: Path, fake_python: Path, ci_python: Path) -> None:
    cli = [str(ci_python), "-m", "hpc.cli"]
    overrides = [f"slurm.{g}.{k}={v}" for g in ("train", "infer", "rollout")
                 for k, v in (("python", str(fake_python)), ("mem_gb", 0.25), ("cpus_per_task", 1))]
    overrides += ["slurm.mode=separate", "slurm.job_name=spoolrl-test", "model.path=/nonexistent-model"]
    out = as_ci_user([*cli, "launch", "--run", str(run_dir), *overrides, "--paths-on-cluster"],
                     cwd=str(run_dir.parent))
    assert out.returncode == 0, out.stderr
    assert [line.split()[3] for line in out.stdout.splitlines() if line.startswith("submitted")] == [
        "(train:", "(infer:", "(rollout:"]
    scale = as_ci_user([*cli, "scale", str(run_dir), "--rollout-nodes", "1"])
    assert scale.returncode == 0, scale.stderr

    def all_running() -> dict | None:
        status = json.loads(as_ci_user([*cli, "status", str(run_dir), "--json"]).stdout)
        return status if [j["state"] for j in status["jobs"]] == ["RUNNING"] * 4 else None

    status = wait_for("4 jobs running", all_running, 60)
    assert isinstance(status, dict)
    assert [(j["kind"], [g["role"] for g in j["groups"]]) for j in status["jobs"]] == [
        ("launch", ["train"]), ("launch", ["infer"]), ("launch", ["rollout"]), ("scale", ["rollout"])]
    scale_id = scale.stdout.split()[2]
    wait_for("the scaled rollout task started", lambda: list((run_dir / "fake").glob(f"rollout-*-j{scale_id}-r0.env")),
             30)
    cancel = as_ci_user([*cli, "cancel", str(run_dir)])
    assert cancel.returncode == 0 and len(cancel.stdout.split(":")[1].split(",")) == 4


def _reference_losses() -> list[float]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(8, 4, generator=gen), torch.randn(8, 1, generator=gen)
    losses = []
    for _ in range(3):
        # the mean of the two ranks' shard means, as DDP averages them
        loss = (((model(x[0::2]) - y[0::2]) ** 2).mean() + ((model(x[1::2]) - y[1::2]) ** 2).mean()) / 2
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_two_node_gloo_rendezvous_from_slurm_env(ci_python: Path) -> None:
    pytest.importorskip("torch", reason="component unavailable: torch is not installed in this venv")
    probe = Path(__file__).with_name("ddp_probe.py")
    out = as_ci_user(["srun", "-p", "gpu", "-N2", "-n2", "--ntasks-per-node=1", "--mem=1G", "-t", "3",
                      str(ci_python), str(probe)], cwd="/tmp")
    assert out.returncode == 0, out.stderr[-2000:]
    ranks = sorted((json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")),
                   key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1] and {r["node"] for r in ranks} == {"gpu1", "gpu2"}
    assert ranks[0]["losses"] == ranks[1]["losses"]
    assert ranks[0]["losses"] == pytest.approx(_reference_losses(), rel=1e-5)


@pytest.mark.apptainer
def test_infer_group_in_a_container_keeps_its_gpu(run_dir: Path, fake_python: Path) -> None:
    from rollout_node.sandbox import default_image
    from rollout_node.sandbox.runtimes import apptainer_unavailable_reason, find_apptainer

    apptainer, image = find_apptainer(), default_image()
    if apptainer is None:
        pytest.skip(f"component unavailable: {apptainer_unavailable_reason()}")
    if not Path(image, "bin", "bash").exists():
        pytest.skip(f"component unavailable: no test image at {image} (scripts/build_image.sh)")
    inner = run_dir / "fake_python.sh"  # inside the container only the run dir (bound) is visible
    config = fast_config(fake_python, f"slurm.infer.container={image}", f"slurm.infer.python={inner}",
                         f"slurm.infer.setup=['export PATH={Path(apptainer).parent}:$PATH']", "slurm.rollout.nodes=1")
    paths = make_run(run_dir, config)
    inner.write_bytes(fake_python.read_bytes())
    inner.chmod(0o755)
    chown_to_ci(paths.root)
    job = _submit(paths, config)
    envs = wait_for("3 tasks started", lambda: len(_envs(paths)) == 3 and _envs(paths), 60)
    assert isinstance(envs, dict)
    infer = next(env for tag, env in envs.items() if tag.startswith("infer"))
    assert infer.get("APPTAINER_CONTAINER") == image  # it ran in the container ...
    assert infer.get("CUDA_VISIBLE_DEVICES") in ("0", "1")  # ... with the GPU Slurm gave the group
    train = next(env for tag, env in envs.items() if tag.startswith("train"))
    assert "APPTAINER_CONTAINER" not in train
    job.cancel()


def _sbatch_as_ci(paths: RunPaths, text: str, name: str) -> str:
    script = paths.slurm / f"{name}.sbatch"
    script.write_text(text)
    chown_to_ci(paths.slurm)
    out = as_ci_user(["sbatch", "--parsable", str(script)], cwd=str(paths.root))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_separate_mode_train_failure_cancels_the_other_jobs(run_dir: Path, fake_python: Path) -> None:
    config = fast_config(fake_python, "slurm.mode=separate", "slurm.rollout.nodes=1")
    paths = make_run(run_dir, config)
    (paths.root / "fake" / "train.plan").write_text("4 5\n")
    chown_to_ci(paths.root / "fake")
    ids = {job.name: _sbatch_as_ci(paths, job.text, job.name) for job in render(config, paths.root)}
    wait_for("train job failed", lambda: _sacct_state(ids["train"]) == "FAILED", 60)
    def siblings_cancelled() -> bool:
        return all(_sacct_state(ids[r]).startswith("CANCELLED") for r in ("infer", "rollout"))

    wait_for("infer and rollout jobs cancelled", siblings_cancelled, 30)
    log = (paths.logs / f"slurm-train-{ids['train']}.out").read_text()
    assert "the train group (het group 0) ended with status 5" in log
    assert f"cancelled job {ids['infer']} on the same run directory" in log


def test_training_done_ends_the_job_and_its_scale_out_jobs(run_dir: Path, fake_python: Path) -> None:
    from hpc.render import render_scale

    config = fast_config(fake_python, "slurm.rollout.nodes=1")
    paths = make_run(run_dir, config)
    (paths.root / "fake" / "train.plan").write_text("5 0\n")
    chown_to_ci(paths.root / "fake")
    het = _sbatch_as_ci(paths, render(config, paths.root)[0].text, "het")
    scale = _sbatch_as_ci(paths, render_scale(config, paths.root, 1).text, "scale")
    wait_for("het job completed", lambda: _sacct_state(het) == "COMPLETED", 60)
    wait_for("scale job cancelled", lambda: _sacct_state(scale).startswith("CANCELLED"), 30)
    assert "job ends: the train group finished" in (paths.logs / f"slurm-{het}.out").read_text()
