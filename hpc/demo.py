"""``spoolrl demo``: the whole loop on one machine, every role a local process (submitit's local executor).

What runs: the lightweight CPU inference engine (``spoolrl infer-node``), a rollout node with bwrap
sandboxes on the built-in tasks (``spoolrl rollout-node``) and the DeepSpeed trainer on CPU
(``spoolrl train-node``), on a tiny model built locally, all on one run directory, exactly the
processes a Slurm job would start. Guarantees:
- No silent fallback: if bwrap cannot run here, it stops before starting anything and says how to
  opt into the unisolated ``local`` runtime explicitly.
- Progress while it runs: a refreshing line on a terminal, else one JSON line at least every 10 s.
- Ctrl-C stops the roles (the trainer checkpoints on SIGTERM); ``spoolrl demo --resume RUN``
  continues the same run from its checkpoint and spool.
A tiny random model cannot fix bugs, so rewards stay near 0: the demo shows the machinery (tokens,
sandboxes, tests, spool, DeepSpeed steps, live policy reloads), not learning.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hpc.config import RunConfig, load_config
from hpc.errors import SandboxError, SpoolrlError, UsageError
from hpc.paths import RunPaths

# The embedded local default: small enough for 2 CPU cores, every component real.
DEMO_OVERRIDES = (
    "run.name=demo",
    "model.path=tiny",
    "trainer.precision=fp32", "trainer.zero_stage=0", "trainer.lr=1e-4", "trainer.checkpoint_every=2",
    "trainer.micro_batch_tokens=4096", "trainer.max_tasks_outstanding=4",
    "slurm.train.gpus_per_node=0", "slurm.infer.gpus_per_node=0",
    "algorithm.group_size=2", "algorithm.groups_per_step=2", "algorithm.drop_zero_variance=false",
    "rollout.max_turns=3", "rollout.max_new_tokens_per_turn=48", "rollout.max_tokens=1536",
    "rollout.run_workers=4", "rollout.eval_workers=1", "rollout.init_workers=1",
    "inference.interface=lo",
    "spool.shard_max_age_s=2.0", "spool.poll_interval_s=1.0",
    # a role killed without its drain (kill -9, a closed laptop) holds claims only this long
    "spool.lease_s=30", "spool.heartbeat_interval_s=5",
)
ROLES = ("infer-node", "rollout-node", "train-node")
JSON_EVERY_S = 5.0


@dataclass
class RoleJobs:
    """The three local jobs of a demo run."""

    jobs: dict[str, Any]

    def alive(self) -> dict[str, bool]:
        return {role: not job.done() for role, job in self.jobs.items()}

    def cancel(self) -> None:
        for job in self.jobs.values():
            if not job.done():
                job.cancel(check=False)


def demo_config(steps: int, overrides: list[str]) -> RunConfig:
    return load_config(None, [*DEMO_OVERRIDES, f"trainer.total_steps={steps}", *overrides])


def check_sandbox(config: RunConfig) -> None:
    """Start one real sandbox before anything else; explain the explicit opt-out if it cannot."""
    from rollout_node.sandbox import open_sandbox

    with tempfile.TemporaryDirectory(prefix="spoolrl-demo-probe-") as work:
        try:
            with open_sandbox(config.sandbox, Path(work)) as sbx:
                result = sbx.exec(["true"], timeout_s=30)
        except (SandboxError, OSError) as exc:
            raise UsageError(_no_sandbox_message(config, str(exc))) from exc
    if result.exit_code != 0:
        raise UsageError(_no_sandbox_message(config, result.output.strip()[-500:]))


def _no_sandbox_message(config: RunConfig, why: str) -> str:
    return (f"the {config.sandbox.runtime} sandbox cannot run here: {why}\n"
            "  spoolrl never falls back silently. Fix it (install bubblewrap; enable unprivileged user namespaces;\n"
            "  build the image with scripts/build_image.sh), or accept NO isolation explicitly:\n"
            "  spoolrl demo sandbox.runtime=local sandbox.allow_local=true")


def run_role(argv: list[str]) -> int:
    """Body of each local job: the same CLI verb a Slurm step runs."""
    from hpc.cli import main

    code = main(argv)
    if code not in (0, None):
        raise RuntimeError(f"spoolrl {' '.join(argv)} exited with status {code}")
    return 0


def start_roles(paths: RunPaths, timeout_min: int) -> RoleJobs:
    import submitit

    executor = submitit.LocalExecutor(folder=paths.slurm / "demo" / "%j")
    executor.update_parameters(timeout_min=timeout_min)
    jobs = {role: executor.submit(run_role, [role, str(paths.root)]) for role in ROLES}
    return RoleJobs(jobs)


def progress(paths: RunPaths) -> dict[str, Any]:
    """A compact view of the run for the progress line (and the JSON lines)."""
    from hpc.metrics import read_metrics

    last: dict[str, dict[str, Any]] = {}
    for rec in read_metrics(paths.root):
        if rec.get("kind") in ("train_step", "node"):
            last[rec["kind"]] = rec
    step = last.get("train_step", {})
    node = last.get("node", {})
    version = (paths.policy_latest.read_text().strip() if paths.policy_latest.exists() else None)
    return {
        "step": step.get("step", 0), "loss": step.get("loss"), "reward_mean": step.get("reward_mean"),
        "policy_version": int(version) if version and version.isdigit() else None,
        "episodes": node.get("episodes", 0), "episodes_per_min": node.get("episodes_per_min"),
        "stages": {"queued": node.get("queue_depth", {}), "busy": node.get("busy", {})},
        "failures": node.get("failures", {}),
    }


def _fmt(p: dict[str, Any], total: int, elapsed: float) -> str:
    reward = "-" if p["reward_mean"] is None else f"{p['reward_mean']:.2f}"
    loss = "-" if p["loss"] is None else f"{p['loss']:.4f}"
    return (f"[{elapsed:5.0f}s] step {p['step']}/{total}  loss {loss}  reward {reward}  "
            f"policy v{p['policy_version'] if p['policy_version'] is not None else '-'}  "
            f"episodes {p['episodes']}  stages {json.dumps(p['stages'], separators=(',', ':'))}")


def monitor(paths: RunPaths, jobs: RoleJobs, total: int, out: TextIO) -> str:
    """Show progress until the trainer finishes or a role dies; returns why it stopped."""
    t0 = time.monotonic()
    last_json = 0.0
    tty = out.isatty()
    while True:
        time.sleep(1.0)
        p = progress(paths)
        elapsed = time.monotonic() - t0
        if tty:
            out.write("\r" + _fmt(p, total, elapsed)[:160].ljust(160))
        elif elapsed - last_json >= JSON_EVERY_S:
            out.write(json.dumps({"demo": "progress", "elapsed_s": round(elapsed, 1), **p}) + "\n")
            last_json = elapsed
        out.flush()
        alive = jobs.alive()
        if not alive["train-node"]:
            return "trainer finished"
        dead = [role for role, ok in alive.items() if not ok]
        if dead:
            return f"{', '.join(dead)} stopped early"


def stop_roles(paths: RunPaths, jobs: RoleJobs, grace_s: float = 60.0) -> None:
    """Ask the rollout and inference roles to drain via the STOP marker, then wait (bounded)."""
    paths.control.mkdir(parents=True, exist_ok=True)
    paths.stop_marker.write_text("demo finished\n")
    deadline = time.monotonic() + grace_s
    while any(jobs.alive().values()) and time.monotonic() < deadline:
        time.sleep(0.5)
    jobs.cancel()


def role_errors(jobs: RoleJobs) -> dict[str, str]:
    errors = {}
    for role, job in jobs.jobs.items():
        if job.done() and job.state not in ("FINISHED", "DONE", "COMPLETED"):
            try:
                job.result()
            except Exception as exc:  # noqa: BLE001 - we report whatever the job died of
                errors[role] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc) else ''}"
    return errors


def prepare_run(out: Path | None, resume: Path | None, steps: int, overrides: list[str]) -> tuple[RunPaths, int]:
    """Create a fresh demo run, or reopen one to resume; returns its paths and the step target."""
    from hpc.cli_run import init_run
    from hpc.rundir import open_run

    if resume is not None:
        if overrides:
            raise UsageError("--resume continues the demo run exactly as it was configured (run.yaml is frozen); "
                             f"drop the overrides {' '.join(overrides)}")
        paths, config = open_run(resume)
        return paths, config.trainer.total_steps
    config = demo_config(steps, overrides)
    check_sandbox(config)
    run = out or Path.cwd() / "runs" / time.strftime("demo-%Y%m%d-%H%M%S")
    if RunPaths(run).run_yaml.exists():
        raise UsageError(f"{run} already holds a run; continue it with 'spoolrl demo --resume {run}'")
    return init_run(str(run), config), steps


def summary(paths: RunPaths, why: str, elapsed: float, errors: dict[str, str]) -> dict[str, Any]:
    from hpc.status import run_status

    status = run_status(paths.root)
    return {"demo": "summary", "run": str(paths.root), "why": why, "elapsed_s": round(elapsed, 1),
            **progress(paths), "spool": status.get("spool"), "trainer": status.get("trainer"),
            "role_errors": errors}


def run_demo(*, out: Path | None, resume: Path | None, steps: int, overrides: list[str],
             stream: TextIO = sys.stdout) -> int:
    t0 = time.monotonic()
    paths, total = prepare_run(out, resume, steps, overrides)
    if paths.stop_marker.exists():
        paths.stop_marker.unlink()  # a resumed demo starts its roles again
    print(f"spoolrl demo: run directory {paths.root}", file=sys.stderr)
    jobs = start_roles(paths, timeout_min=120)
    try:
        why = monitor(paths, jobs, total, stream)
    except KeyboardInterrupt:
        print("\ninterrupted: the roles drain (claims go back to the spool, the trainer keeps its checkpoint)",
              file=sys.stderr)
        stop_roles(paths, jobs, grace_s=45.0)
        print(f"continue with: spoolrl demo --resume {paths.root}", file=sys.stderr)
        return 130
    stop_roles(paths, jobs)
    errors = role_errors(jobs)
    result = summary(paths, why, time.monotonic() - t0, errors)
    if stream.isatty():
        stream.write("\n")
    stream.write(json.dumps(result, default=str) + "\n")
    ok = result["step"] >= total and not errors
    print(f"spoolrl demo: {'done' if ok else 'FAILED'}: {result['step']}/{total} steps in {result['elapsed_s']} s; "
          f"run directory {paths.root}; next: spoolrl report {paths.root}", file=sys.stderr)
    if not ok:
        raise SpoolrlError(f"demo did not finish ({why}); role errors: {errors or 'none'}; logs in {paths.slurm}")
    return 0
