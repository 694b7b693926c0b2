"""``spoolrl demo``: the whole loop on one machine, every role a local process (submitit's local executor).

What runs: the lightweight CPU inference engine (``spoolrl infer-node``), a rollout node with bwrap
sandboxes on the built-in tasks (``spoolrl rollout-node``) and the DeepSpeed trainer on CPU
(``spoolrl train-node``), on a tiny model built locally, all on one run directory, exactly the
processes a Slurm job would start. Guarantees:
- No silent fallback: if bwrap cannot run here, it stops before starting anything and says how to
  opt into the unisolated ``local`` runtime explicitly.
- Progress while it runs: a refreshing line on a terminal, else one JSON line at least every 10 s.
- Ctrl-C, SIGTERM or SIGHUP stops the roles (the trainer checkpoints), nothing is left running;
  ``spoolrl demo --resume RUN`` continues the same run from its checkpoint and spool.
- What it trains: the learnable built-in family (``tasks.source: builtin-pick``: write the one of 4
  values the statement names) from the tiny model warm-started on format-only, value-balanced
  episodes (:mod:`hpc.cli.demo_model`: well-formed calls, reward ~1/4 before RL), sampling at
  temperature 0.7 with a live policy reload after every step, with the one-line system prompt, one
  task of each value in every step of 4 x 8 episodes and the forward KL against the warm start (the
  choices ``scripts/probe_pick_learning.py`` measured to read the statement at all), and an lr that each
  step's measured KL sets (``trainer.target_kl``, peak 3e-4), so that no early step swings every
  statement's answer onto one value. Over the default 40 steps the reward rises from ~0.25 to ~0.8 (0.78-0.89 measured)
  (the README has every measured run, seeds and temperatures).
  ``model.path=tiny`` gives the random model, ``tasks.source=builtin`` the bug fixes (reward stays 0:
  that shows the machinery, not learning).
- The reward of every trainer step is printed as it lands (a line on a terminal, a JSON line
  otherwise), and the summary compares the first steps with the last ones: the reward is the mean over
  every finished episode of the step's tasks, the trained batch's (after filters) beside it
  (:mod:`hpc.report_summary`, which ``status`` and the report print too).
- ``rollout.policy=harness`` (with ``rollout.harness.prefix``, an install, and ``rollout.harness.command``)
  trains that harness instead of the built-in agent: each episode runs it in a sandbox against the rollout
  node's gateway (the README's example: ``examples/harness``); the summary adds the harness episodes'
  segments and tokens prefilled again (``harness``, :func:`hpc.report_summary.harness_summary`).
- Logs: each role's stdout and stderr in ``RUN/logs/<train|infer|rollout>/`` (submitit's local executor:
  ``<pid>_0_log.out``/``.err`` beside its submission/result pickles), the roles' own log files in
  ``RUN/logs/``; the final summary (the JSON line printed last) in ``RUN/summary.json``.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from hpc.cli.util import check_job
from hpc.config import RunConfig, load_config
from hpc.errors import RecordError, SandboxError, SpoolrlError, UsageError
from hpc.fsutil import atomic_write_text
from hpc.paths import RunPaths
from hpc.records import read_policy_latest
from hpc.report_summary import harness_line
from hpc.rundir import open_run

# The embedded local default: small enough for 2 CPU cores, every component real.
# model.path is filled in by demo_config: the warm-started tiny model of hpc.cli.demo_model (unless overridden).
DEMO_OVERRIDES = (
    "run.name=demo",
    # one task of each value in every step (a step of random tasks lets the policy drift onto one value
    # unopposed; scripts/probe_pick_learning.py): the file lists the values in turn, and only one step's
    # tasks are outstanding at a time (trainer.max_tasks_outstanding = groups_per_step), because the
    # rollout node claims outstanding tasks in random order; it also keeps samples nearly on-policy
    "tasks.source=builtin-pick", "tasks.epochs=1000", "tasks.order=file",
    "trainer.precision=fp32", "trainer.zero_stage=0", "trainer.lr=3e-4", "trainer.checkpoint_every=5",
    "trainer.micro_batch_tokens=1024", "trainer.max_tasks_outstanding=4", "trainer.publish_every=1",
    "slurm.train.gpus_per_node=0", "slurm.infer.gpus_per_node=0",
    "algorithm.group_size=8", "algorithm.groups_per_step=4", "algorithm.drop_zero_variance=false",
    # one baseline for the step's 32 samples, not one per group: a statement whose group all gave the same
    # wrong value is trained away from it (with a group baseline that group carries no signal, and a value
    # the policy stopped giving for one kind of statement stayed dead for many steps)
    "algorithm.advantage_norm=batch_mean",
    # the forward KL against the warm start keeps every value alive (k3's pull vanishes on an abandoned one)
    "algorithm.kl_coef=0.1", "algorithm.kl_estimator=forward",
    # lr 3e-4 is the peak: each step's measured KL sets the next step's lr (early Adam steps at a fixed 3e-4
    # swung every statement's answer onto one value, and the values that lost it stayed dead for 10-20 steps)
    "trainer.target_kl=6e-4",  # nats per loss token: the 0.05 per 82-token episode the demo was tuned with
    "rollout.system_prompt=brief", "rollout.max_turns=3", "rollout.max_new_tokens_per_turn=72", "rollout.max_tokens=1024",
    "rollout.observation_max_tokens=128",
    "rollout.run_workers=8", "rollout.eval_workers=2", "rollout.init_workers=2",
    "inference.interface=lo", "inference.temperature=0.7",
    "spool.shard_max_age_s=2.0", "spool.poll_interval_s=1.0",
    # a role killed without its drain (kill -9, a closed laptop) holds claims only this long
    "spool.lease_s=30", "spool.heartbeat_interval_s=5",
)
ROLES = {"infer-node": "infer", "rollout-node": "rollout", "train-node": "train"}  # verb -> RUN/logs/<dir>
JSON_EVERY_S = 5.0
DEFAULT_STEPS = 40


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
    """The demo's defaults + ``overrides``; without a ``model.path`` override, the warm-started model.

    Checked as every verb checks a run (:func:`hpc.cli.util.check_job`: the paths it reads, a model's chat
    template, the harness install) before the warm start and before anything starts: ConfigError, exit 2."""
    base = [*DEMO_OVERRIDES, f"trainer.total_steps={steps}"]
    config = check_job(load_config(None, [*base, *overrides]))
    if any(o.split("=", 1)[0].strip() == "model.path" for o in overrides):
        return config
    from hpc.cli.demo_model import warm_model

    t0 = time.monotonic()
    model = warm_model(seed=config.run.seed, system_prompt=config.rollout.system_prompt)
    print(f"spoolrl demo: warm-started tiny model {model} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    return load_config(None, [*base, f"model.path={model}", *overrides])


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

    jobs = {}
    for role, log_dir in ROLES.items():  # one executor per role: its output lands in RUN/logs/<role>/
        executor = submitit.LocalExecutor(folder=paths.logs / log_dir)
        executor.update_parameters(timeout_min=timeout_min)
        jobs[role] = executor.submit(run_role, [role, str(paths.root)])
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
    try:
        version = read_policy_latest(paths)
    except (OSError, RecordError):
        version = None
    return {
        "step": step.get("step", 0), "loss": step.get("loss"), "reward_mean": step.get("reward_mean"),
        "policy_version": version,
        "episodes": node.get("episodes", 0), "episodes_per_min": node.get("episodes_per_min"),
        "stages": {"queued": node.get("queue_depth", {}), "busy": node.get("busy", {})},
        "failures": node.get("failures", {}),
    }


def _fmt(p: dict[str, Any], total: int, elapsed: float) -> str:
    reward = "-" if p["reward_mean"] is None else f"{p['reward_mean']:.2f}"
    loss = "-" if p["loss"] is None else f"{p['loss']:.4f}"
    return (f"[{elapsed:5.0f}s] step {p['step']}/{total}  loss {loss}  trained batch reward {reward}  "
            f"policy v{p['policy_version'] if p['policy_version'] is not None else '-'}  "
            f"episodes {p['episodes']}  stages {json.dumps(p['stages'], separators=(',', ':'))}")


def step_rewards(paths: RunPaths) -> list[dict[str, Any]]:
    """:func:`hpc.report_summary.step_rewards` of the run's metrics so far."""
    from hpc.metrics import read_metrics
    from hpc.report_summary import step_rewards as rows

    return rows(read_metrics(paths.root))


def _report_steps(paths: RunPaths, shown: int, out: TextIO, tty: bool, elapsed: float) -> int:
    """Print the trainer steps that landed since ``shown``; returns the last step shown."""
    for row in step_rewards(paths):
        if row["step"] <= shown:
            continue
        reward = row["reward"] if row["reward"] is not None else row["trained_batch_reward"] or 0.0
        if tty:
            batch = row["trained_batch_reward"]
            out.write("\r" + f"[{elapsed:5.0f}s] step {row['step']}: reward {reward:.2f} "
                      f"({row['episodes']} episodes; trained batch {'-' if batch is None else f'{batch:.2f}'})  "
                      + "#" * round(reward * 40) + " " * 20 + "\n")
        else:
            out.write(json.dumps({"demo": "step", "elapsed_s": round(elapsed, 1), **row}) + "\n")
        shown = row["step"]
    return shown


def monitor(paths: RunPaths, jobs: RoleJobs, total: int, out: TextIO) -> str:
    """Show progress until the trainer finishes or a role dies; returns why it stopped."""
    t0 = time.monotonic()
    last_json = 0.0
    shown = 0
    tty = out.isatty()
    while True:
        time.sleep(1.0)
        p = progress(paths)
        elapsed = time.monotonic() - t0
        shown = _report_steps(paths, shown, out, tty, elapsed)
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
    """Ask the rollout and inference roles to drain via the STOP marker, then wait (bounded); whatever is
    still running then is cancelled, also when the wait itself is cut short (a second Ctrl-C or SIGTERM
    during the drain, the run directory gone), so the demo never exits with a role left running."""
    try:
        paths.control.mkdir(parents=True, exist_ok=True)
        paths.stop_marker.write_text("demo finished\n")
        deadline = time.monotonic() + grace_s
        while any(jobs.alive().values()) and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        jobs.cancel()


def role_errors(jobs: RoleJobs) -> dict[str, str]:
    """What each ended role died of (its result raised: a verb that exited non-zero, a crash, a cancel). A local
    job's state is ``FINISHED`` whether its function returned or raised, so the result decides."""
    errors = {}
    for role, job in jobs.jobs.items():
        if job.done():
            try:
                job.result()
            except Exception as exc:  # noqa: BLE001 - we report whatever the job died of
                errors[role] = died_of(exc)
    return errors


def died_of(exc: BaseException) -> str:
    """One line: the last ``SomeError: message`` line of the job's error (submitit wraps the role's traceback
    in its own message, whose last lines name the log files), else the error's last line."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b[^:]*:", ln)]
    return f"{type(exc).__name__}: {(named or lines or [''])[-1][:300]}"


def prepare_run(out: Path | None, resume: Path | None, steps: int, overrides: list[str]) -> tuple[RunPaths, int]:
    """Create a fresh demo run, or reopen one to resume; returns its paths and the step target."""
    from hpc.cli.run import init_run

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
    """The demo's last JSON line, also written to ``RUN/summary.json``."""
    from hpc.report_summary import reward_summary
    from hpc.status import run_status

    status = run_status(paths.root)
    return {"demo": "summary", "run": str(paths.root), "why": why, "elapsed_s": round(elapsed, 1),
            **progress(paths), **reward_summary(step_rewards(paths)), "spool": status.get("spool"),
            "trainer": status.get("trainer"), "nonfinite_steps": (status.get("training") or {}).get("nonfinite_steps"),
            "harness": (status.get("summary") or {}).get("harness"), "logs": str(paths.logs), "role_errors": errors}


def _interrupt_on(*signums: int) -> dict[int, Any]:
    """Make these signals stop the demo as Ctrl-C does (roles drained, nothing orphaned; a ``kill``, a
    closed terminal or ``timeout`` would otherwise leave the inference server running); returns the
    previous handlers. A shell's background job starts with SIGINT ignored, so SIGTERM is its Ctrl-C."""

    def interrupt(signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    return {s: signal.signal(s, interrupt) for s in signums}


def run_demo(*, out: Path | None, resume: Path | None, steps: int, overrides: list[str],
             stream: TextIO = sys.stdout) -> int:
    t0 = time.monotonic()
    paths, total = prepare_run(out, resume, steps, overrides)
    if paths.stop_marker.exists():
        paths.stop_marker.unlink()  # a resumed demo starts its roles again
    print(f"spoolrl demo: run directory {paths.root}", file=sys.stderr)
    jobs = start_roles(paths, timeout_min=120)
    previous = _interrupt_on(signal.SIGTERM, signal.SIGHUP)
    try:
        why = monitor(paths, jobs, total, stream)
    except KeyboardInterrupt:
        print("\ninterrupted: the roles drain (claims go back to the spool, the trainer keeps its checkpoint)",
              file=sys.stderr)
        stop_roles(paths, jobs, grace_s=45.0)
        print(f"continue with: spoolrl demo --resume {shlex.quote(str(paths.root))}", file=sys.stderr)
        return 130
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    stop_roles(paths, jobs)
    errors = role_errors(jobs)
    result = summary(paths, why, time.monotonic() - t0, errors)
    if stream.isatty():
        stream.write("\n")
    text = json.dumps(result, default=str)
    stream.write(text + "\n")
    atomic_write_text(paths.root / "summary.json", text + "\n")
    ok = result["step"] >= total and not errors
    first, last = result["reward_first"], result["reward_last"]
    if first is not None:
        batch = (f"; trained batch (after filters) {result['trained_batch_reward_first']:.2f} -> "
                 f"{result['trained_batch_reward_last']:.2f}" if "trained_batch_reward_first" in result else "")
        print(f"spoolrl demo: reward {first:.2f} (mean of the first {result['reward_first_steps']} steps) -> "
              f"{last:.2f} (last {result['reward_last_steps']}), over {result['reward_of']}{batch}", file=sys.stderr)
    if result["harness"]:
        print(f"spoolrl demo: {harness_line(result['harness'])}", file=sys.stderr)
    print(f"spoolrl demo: {'done' if ok else 'FAILED'}: {result['step']}/{total} steps in {result['elapsed_s']} s; "
          f"run directory {paths.root} (summary.json, logs/); next: spoolrl report {shlex.quote(str(paths.root))}",
          file=sys.stderr)
    if not ok:
        raise SpoolrlError(f"demo did not finish ({why}); role errors: {errors or 'none'}; logs in {paths.logs}")
    return 0
