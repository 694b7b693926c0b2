"""spoolrl from Python: create, submit, watch, resume, scale and cancel a run (:class:`Run`).

::

    from hpc.cli.api import Run

    run = Run.create("runs/exp1", config="run.yaml", overrides=["trainer.lr=1e-5"])
    submission = run.submit()                  # what 'spoolrl launch' does; submission.job_ids
    state = run.wait(progress=lambda s: print(s["trainer"]["step"]))   # "COMPLETED", or RunFailed

The API lives in the CLI face (``hpc.cli``) because that is the one package that may import the
roles (``tests/unit/test_layering.py``): creating a run may build the tiny model (``train_node``)
and listing checkpoints reads the trainer's lineage. The verbs ``launch``, ``status``, ``cancel``,
``resume``, ``scale`` and ``checkpoints`` call this module: one code path. The Slurm fan-out of
``spoolrl tasks check`` is :func:`hpc.cli.tasks_slurm.check_tasks_on_slurm`.

Guarantees:
- :meth:`Run.create` validates the config (and renders its scripts) before it touches the disk,
  exactly as ``spoolrl launch`` does: the same :class:`~hpc.errors.ConfigError` naming every bad key,
  the same :class:`~hpc.errors.RunDirError` for an occupied directory; on an error nothing is created.
- :meth:`Run.submit`, :meth:`Run.resume` and :meth:`Run.scale` write the same scripts to
  ``RUN/slurm/`` and the same ledger ``RUN/slurm/jobs.json`` as the verbs, and return a
  :class:`Submission`: submitit handles of the job(s) (het job ids understood, see
  :mod:`hpc.launch`) with ``state``, ``done()``, ``wait()``/``result()`` and ``cancel()``.
- :meth:`Run.status` is the document ``spoolrl status --json`` prints (:mod:`hpc.status`).
- ``wait`` returns the final Slurm state of the submission (``COMPLETED``, ``CANCELLED``), raises
  :class:`RunFailed` naming the failing group (the batch script's ``job ends:`` line) when a job
  ended FAILED/TIMEOUT/NODE_FAIL/OUT_OF_MEMORY/BOOT_FAIL/DEADLINE, and ``TimeoutError`` after
  ``timeout`` seconds (the jobs keep running). A job neither sacct nor squeue knows reads UNKNOWN and
  counts as not ended (without accounting, pass a ``timeout``).
"""

from __future__ import annotations

import shlex
import time
import typing as tp
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hpc.cli.util import check_job
from hpc.config import RunConfig, apply_overrides, config_from_dict, load_config, to_dict
from hpc.config.checks import job_problems
from hpc.errors import ConfigError, RunDirError, SpoolrlError, UsageError
from hpc.launch import ACTIVE_STATES, HetSlurmJob, JobRecord, known_jobs, query_states, track
from hpc.paths import RunPaths
from hpc.render import RenderedJob
from hpc.rundir import check_resume, open_run, require_run

Status = dict[str, tp.Any]
ConfigSource = str | Path | Mapping[str, tp.Any] | RunConfig | None
FAILED_STATES = ("FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


class RunFailed(SpoolrlError):
    """A job of the run ended in a failed state; the message names the failing group."""


def load_run_config(config: ConfigSource, overrides: Sequence[str] = ()) -> RunConfig:
    """A config file, a plain dict (a run.yaml's content) or a RunConfig, plus dotted overrides,
    validated as ``spoolrl launch --config FILE key=value ...`` validates it."""
    if config is None or isinstance(config, (str, Path)):
        return load_config(config, overrides)
    data = to_dict(config) if isinstance(config, RunConfig) else dict(config)
    return config_from_dict(apply_overrides(data, overrides))


def config_source(config: ConfigSource, overrides: Sequence[str] = ()) -> str:
    """How a script names where its config came from (a comment in the rendered script)."""
    if config is None:
        origin = "(built-in defaults)"
    elif isinstance(config, (str, Path)):
        origin = str(config)
    else:
        origin = "(python)"
    return " ".join([origin, *map(shlex.quote, overrides)])


def render_jobs(config: RunConfig, run_dir: str | Path, source: str, *, service: bool = False) -> list[RenderedJob]:
    """The run's batch script(s) (pure): the het job (or one per role), or the rollout-only service job."""
    from hpc.render import render, render_service

    return [render_service(config, run_dir, source=source)] if service else render(config, run_dir, source=source)


@dataclass
class Submission:
    """The job(s) of one submission (a launch, resume or scale), as submitit handles.

    ``jobs`` are :class:`hpc.launch.HetSlurmJob` (submitit ``SlurmJob`` subclasses); empty for a dry run,
    whose scripts are in ``scripts`` / :attr:`text`."""

    root: Path
    kind: str
    records: list[JobRecord]
    scripts: list[RenderedJob] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)  # resume: the resumable keys that changed

    @property
    def jobs(self) -> list[HetSlurmJob]:
        return [track(RunPaths(self.root), r.job_id) for r in self.records]

    @property
    def job_ids(self) -> list[str]:
        return [r.job_id for r in self.records]

    @property
    def text(self) -> str:
        from hpc.render import joined_text

        return joined_text(self.scripts)

    def states(self) -> dict[str, list[str]]:
        """job id -> Slurm state of each of its het groups (UNKNOWN until Slurm lists it)."""
        known = query_states(self.job_ids)
        return {j: known.get(j) or ["UNKNOWN"] for j in self.job_ids}

    @property
    def state(self) -> str:
        """One state for the submission: a failed job's state if any failed, else the first job's."""
        return _overall(self.states())

    def done(self) -> bool:
        return bool(self.records) and all(_finished(s) for s in self.states().values())

    def cancel(self) -> None:
        """scancel every job of this submission (the run directory stays; ``Run.resume`` continues it)."""
        from hpc.launch import scancel

        scancel(self.job_ids)

    def wait(self, timeout: float | None = None, *, poll_s: float = 2.0,
             progress: Callable[[Status], None] | None = None) -> str:
        """Block until every job of the submission has ended; the final state (see the module's guarantees).

        ``progress`` gets the run's status document (``spoolrl status --json``) at every poll."""
        from hpc.status import run_status

        if not self.records:
            raise UsageError("nothing was submitted (a dry run): there is nothing to wait for")
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            states = self.states()
            if progress is not None:
                progress(run_status(self.root))
            if all(_finished(s) for s in states.values()):
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"{self.root}: job(s) {', '.join(self.job_ids)} still {_overall(states)} "
                                   f"after {timeout:g} s (they keep running; 'spoolrl cancel {self.root}' stops them)")
            time.sleep(poll_s)
        failed = [(r, states[r.job_id]) for r in self.records if _failed(states[r.job_id])]
        if failed:
            raise RunFailed("; ".join(_failure_message(self.root, r, s) for r, s in failed))
        return _overall(states)

    result = wait  # submitit's name for it


def _word(state: str) -> str:
    return state.split()[0] if state else "UNKNOWN"  # "CANCELLED by 1002" -> CANCELLED


def _finished(group_states: list[str]) -> bool:
    return all(_word(s) not in (*ACTIVE_STATES, "UNKNOWN") for s in group_states)


def _failed(group_states: list[str]) -> bool:
    return any(_word(s) in FAILED_STATES for s in group_states)


def _overall(states: Mapping[str, list[str]]) -> str:
    for group_states in states.values():
        for s in group_states:
            if _word(s) in FAILED_STATES:
                return _word(s)
    first = next(iter(states.values()), ["UNKNOWN"])
    return _word(first[0])


def _failure_message(root: Path, record: JobRecord, group_states: list[str]) -> str:
    """The batch script's last ``job ends:`` line (it names the failing group), else the Slurm states."""
    logs = sorted(RunPaths(root).logs.glob(f"slurm-*{record.job_id}.out"))
    ends = [line.split("job ends: ", 1)[1] for f in logs for line in f.read_text(errors="replace").splitlines()
            if "job ends: " in line]
    groups = ", ".join(f"{role} {state}" for role, state in zip(record.roles, group_states, strict=False))
    detail = ends[-1] if ends else f"groups: {groups or ', '.join(group_states)}"
    return f"job {record.job_id} ({record.name}) {_overall({record.job_id: group_states})}: {detail}"


@dataclass
class Run:
    """A run directory: create or open it, then submit, watch, resume, scale or cancel its jobs."""

    paths: RunPaths
    config: RunConfig
    source: str  # where the config came from, as the rendered scripts name it

    @property
    def root(self) -> Path:
        return self.paths.root

    @classmethod
    def create(cls, run_dir: str | Path, config: ConfigSource = None, overrides: Sequence[str] = (), *,
               source: str | None = None, paths_on_cluster: bool = False) -> Run:
        """Validate ``config`` + ``overrides`` as ``spoolrl launch`` does and create ``run_dir`` (what
        ``spoolrl init`` does); starts nothing. A directory left by a submission that failed (a run.yaml, no
        job ever recorded) is taken again when its config is the same.

        ``config``: a YAML file, a dict shaped like run.yaml, a RunConfig, or None (the defaults).
        ``paths_on_cluster``: the config's paths exist only on the cluster (not checked from here)."""
        from hpc.cli.run import init_run

        cfg = check_job(load_run_config(config, overrides), paths_on_cluster=paths_on_cluster)
        root = Path(run_dir).absolute()
        src = source or config_source(config, overrides)
        render_jobs(cfg, root, src)  # a config that cannot be rendered fails here, before the disk is touched
        unsubmitted = (root / "run.yaml").exists() and not known_jobs(RunPaths(root))
        return cls(init_run(str(root), cfg, if_missing=unsubmitted), cfg, src)

    @classmethod
    def open(cls, run_dir: str | Path) -> Run:
        """An existing run directory (its frozen run.yaml)."""
        paths, config = open_run(Path(run_dir).absolute())
        return cls(paths, config, str(paths.run_yaml))

    def render(self, *, service: bool = False) -> str:
        """The batch script text ``submit`` would sbatch (``spoolrl render``'s output)."""
        from hpc.render import joined_text

        return joined_text(render_jobs(self.config, self.root, self.source, service=service))

    def submit(self, dry_run: bool = False, *, service: bool = False) -> Submission:
        """sbatch the run's job(s) (``spoolrl launch``); a run that already has jobs is continued with
        :meth:`resume` instead. ``dry_run``: render only (``Submission.text``), submit nothing."""
        scripts = render_jobs(self.config, self.root, self.source, service=service)
        if not dry_run and known_jobs(self.paths):
            raise RunDirError(f"{self.root} already has submitted jobs; continue it with Run.resume() "
                              f"('spoolrl resume {self.root}')")
        return self._submit(scripts, "launch", dry_run)

    def resume(self, overrides: Sequence[str] = (), *, force: bool = False, dry_run: bool = False) -> Submission:
        """Submit a new job continuing the run from its latest checkpoint and the spool (``spoolrl resume``).

        ``overrides`` may change only resumable keys; refused while a job of the run is active unless ``force``."""
        from hpc.launch import active_jobs
        from hpc.render import render

        active = active_jobs(self.paths)
        if active and not force:
            ids = ", ".join(f"{r.job_id} ({state})" for r, state in active)
            raise RunDirError(f"{self.root} still has active jobs: {ids}; 'spoolrl cancel {self.root}' first "
                              "(or --force to add another job)")
        config = config_from_dict(apply_overrides(to_dict(self.config), overrides)) if overrides else self.config
        if problems := job_problems(config):
            raise ConfigError(problems)
        changed = check_resume(self.config, config)
        scripts = render(config, self.root, source=f"{self.paths.run_yaml} (resume) {' '.join(overrides)}".strip())
        submission = self._submit(scripts, "resume", dry_run)
        submission.changed = list(changed)
        return submission

    def scale(self, rollout_nodes: int, *, dry_run: bool = False) -> Submission:
        """Add a job of ``rollout_nodes`` rollout-only nodes to the running run (``spoolrl scale``)."""
        from hpc.render import render_scale

        if rollout_nodes < 1:
            raise UsageError("--rollout-nodes must be at least 1")
        script = render_scale(self.config, self.root, rollout_nodes, source=f"{self.paths.run_yaml} (scale)")
        return self._submit([script], "scale", dry_run)

    def _submit(self, scripts: list[RenderedJob], kind: str, dry_run: bool) -> Submission:
        from hpc.launch import submit

        records = [] if dry_run else [record for record, _ in submit(self.paths, scripts, kind=kind)]
        return Submission(self.root, kind, records, scripts)

    def status(self) -> Status:
        """``spoolrl status RUN --json``'s document (schema in :mod:`hpc.status`)."""
        from hpc.status import run_status

        return run_status(self.root)

    def latest(self) -> Submission:
        """The newest launch or resume submission (its jobs; scale-out jobs are not part of it)."""
        records = [r for r in known_jobs(self.paths) if r.kind != "scale"]
        if not records:
            raise RunDirError(f"{self.root} has no submitted job yet; submit it with Run.submit() ('spoolrl launch')")
        last = records[-1]
        batch = [r for r in records if _submission_of(r) == _submission_of(last)]
        return Submission(self.root, last.kind, batch)

    def wait(self, timeout: float | None = None, *, poll_s: float = 2.0,
             progress: Callable[[Status], None] | None = None) -> str:
        """Wait for :meth:`latest` to end: :meth:`Submission.wait`."""
        return self.latest().wait(timeout, poll_s=poll_s, progress=progress)

    def cancel(self) -> list[str]:
        """scancel every active job of the run (``spoolrl cancel``); their ids. The directory stays."""
        from hpc.launch import cancel_all

        return cancel_all(self.paths)

    def checkpoints(self) -> list[dict[str, tp.Any]]:
        """The checkpoints of the run's lineage, oldest first (``spoolrl checkpoints --json``'s rows)."""
        return checkpoint_rows(self.paths)


def checkpoint_rows(paths: RunPaths) -> list[dict[str, tp.Any]]:
    """The lineage of ``paths``' checkpoints, oldest first, as ``spoolrl checkpoints --json`` lists it."""
    from train_node.trainer.checkpoint import lineage

    if not paths.checkpoints.is_dir():
        require_run(paths.root)  # neither checkpoints/ nor a run: the one wording
    return [{"tag": m["tag"], "step": m["step"], "policy_version": m["policy_version"], "parent": m.get("parent"),
             "has_state": m["has_state"], "world_size": m.get("world_size"), "shards": m.get("shards", []),
             "fence_generation": m.get("fence_generation"), "t": m.get("t")} for m in lineage(paths)]


def _submission_of(record: JobRecord) -> str:
    """The jobs of one :func:`hpc.launch.submit` share ``record.submission``; a job submitted without spoolrl
    (or recorded before submissions were named) is a submission of its own."""
    return record.submission or record.job_id
