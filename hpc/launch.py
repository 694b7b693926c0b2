"""Submitting rendered jobs and tracking them with submitit.

Guarantees:
- What is submitted is byte for byte what :mod:`hpc.render` produced (``launch --dry-run`` prints
  it unchanged); a copy of every submitted script is kept in ``RUN/slurm/``.
- submitit has no het-job API, so the rendered script goes to ``sbatch`` and the job is tracked
  through submitit's ``SlurmJob`` with a watcher that understands het job ids (sacct reports the
  leader as ``N+0`` and the other groups as ``N+k``; plain submitit looks up ``N`` only and would
  report UNKNOWN forever, and wait forever on a cancelled job).
- Every submission is recorded in ``RUN/slurm/jobs.json`` (atomic rewrite): job id, kind
  (launch/resume/scale), the roles of its groups, the script and the submission it belongs to
  (``<kind>-<time>-<n>``, unique in the run: ``n`` counts the ledger's records, so two submissions
  in the same second stay apart); ``status``/``cancel`` read it.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
import typing as tp
from dataclasses import asdict, dataclass
from pathlib import Path

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

from hpc.errors import SlurmError
from hpc.fsutil import atomic_write_text
from hpc.paths import RunPaths
from hpc.render import RenderedJob

_HET_ID = re.compile(r"^(\d+)\+(\d+)$")
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "RESIZING", "SUSPENDED",
                 "REQUEUE_HOLD", "REQUEUE_FED", "PREEMPTED", "SIGNALING", "STAGE_OUT")


class HetSlurmInfoWatcher(SlurmInfoWatcher):
    """submitit's sacct watcher, plus het job ids: ``N+0`` also answers for ``N``; ``N+k`` is kept."""

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        lines = text.splitlines()
        if len(lines) < 2:
            return {}
        names = lines[0].split("|")
        plain, het = [lines[0]], {}
        for line in lines[1:]:
            stats = {k: v.strip() for k, v in zip(names, line.split("|"), strict=False)}
            match = _HET_ID.match(stats.get("JobID", ""))
            if match:
                het[stats["JobID"]] = stats
                if match.group(2) == "0":
                    het[match.group(1)] = stats
            else:
                plain.append(line)
        info = super().read_info("\n".join(plain)) if len(plain) > 1 else {}
        info.update(het)
        return info

    def cached(self, key: str) -> dict[str, str]:
        """What the last sacct call said about ``key`` (e.g. ``N+1``), without registering it."""
        return self._info_dict.get(key, {})


class HetSlurmJob(SlurmJob[tp.Any]):
    """A submitit ``SlurmJob`` for a het (or plain) job submitted from a rendered script."""

    watcher = HetSlurmInfoWatcher(delay_s=60)

    def group_states(self, num_groups: int) -> list[str]:
        """Slurm state of each het group (UNKNOWN until sacct lists it)."""
        info = self.watcher.get_info(self.job_id, mode="force")
        if num_groups == 1:
            return [info.get("State") or "UNKNOWN"]
        watcher = tp.cast(HetSlurmInfoWatcher, self.watcher)
        return [watcher.cached(f"{self.job_id}+{k}").get("State") or "UNKNOWN" for k in range(num_groups)]

    def _interrupt(self, timeout: bool = False) -> None:
        """Send the time-limit warning (SIGUSR1 to the batch shell): the job drains and requeues.
        With ``timeout=False`` it is a preemption: SIGTERM to every step first, as Slurm does."""
        if not timeout:
            subprocess.check_call(["scancel", "--signal=TERM", self.job_id])
        subprocess.check_call(["scancel", "--batch", "--signal=USR1", self.job_id])


@dataclass(frozen=True)
class JobRecord:
    """One submitted job, as kept in RUN/slurm/jobs.json."""

    job_id: str
    name: str
    kind: str
    roles: list[str]
    script: str
    submitted_at: float
    submission: str = ""  # shared by the jobs of one submit() ('' for a job submitted without spoolrl)


def submitit_folder(paths: RunPaths) -> Path:
    return paths.slurm / "submitit"


def track(paths: RunPaths, job_id: str) -> HetSlurmJob:
    """A submitit handle on a submitted job (state, done(), cancel())."""
    return HetSlurmJob(folder=submitit_folder(paths), job_id=job_id)


def sbatch(script: Path, *, cwd: Path) -> str:
    """Submit ``script``; returns the job id (the het leader's)."""
    try:
        out = subprocess.run(["sbatch", "--parsable", str(script)], cwd=cwd, capture_output=True, text=True,
                             timeout=120, check=False)
    except FileNotFoundError as exc:
        raise SlurmError("sbatch not found: run this on a Slurm login node (or scripts/local_slurm.sh up)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmError("sbatch did not answer within 120 s; is slurmctld up? (scontrol ping)") from exc
    if out.returncode != 0:
        raise SlurmError(f"sbatch refused {script}: {out.stderr.strip() or out.stdout.strip()}")
    job_id = out.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out.stdout!r}")
    return job_id


def read_records(paths: RunPaths) -> list[JobRecord]:
    try:
        data = json.loads((paths.slurm / "jobs.json").read_text())
    except (OSError, ValueError):
        return []
    return [JobRecord(**item) for item in data.get("jobs", [])]


def discovered_records(paths: RunPaths) -> list[JobRecord]:
    """Jobs known only from their batch scripts' event files (a rendered script submitted with plain
    ``sbatch``): every spoolrl batch script writes ``RUN/metrics/batch-<job id>.jsonl``."""
    out = []
    for f in sorted(paths.metrics.glob("batch-*.jsonl")) if paths.metrics.is_dir() else []:
        job_id = f.stem.removeprefix("batch-")
        try:
            first = json.loads(f.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            continue
        roles = str(first.get("roles", "")).split() if first.get("kind") == "job_start" else []
        name = "het" if len(roles) > 1 else (roles[0] if roles else "?")
        out.append(JobRecord(job_id=job_id, name=name, kind="sbatch", roles=roles, script="",
                             submitted_at=float(first.get("t", 0))))
    return out


def known_jobs(paths: RunPaths) -> list[JobRecord]:
    """Jobs submitted through spoolrl (RUN/slurm/jobs.json), then any others that ran on this run dir."""
    records = read_records(paths)
    seen = {r.job_id for r in records}
    extra = [r for r in discovered_records(paths) if r.job_id.isdigit() and r.job_id not in seen]
    return records + sorted(extra, key=lambda r: r.submitted_at)


def _append_record(paths: RunPaths, record: JobRecord) -> None:
    records = [*read_records(paths), record]
    text = json.dumps({"jobs": [asdict(r) for r in records]}, indent=1) + "\n"
    paths.slurm.mkdir(parents=True, exist_ok=True)
    atomic_write_text(paths.slurm / "jobs.json", text)


def roles_of(job: RenderedJob, default: tp.Sequence[str]) -> list[str]:
    """The roles of a rendered job, read back from its ``ROLES=(...)`` line."""
    match = re.search(r"^ROLES=\(([^)]*)\)", job.text, re.M)
    return match.group(1).split() if match else list(default)


def submit(paths: RunPaths, jobs: list[RenderedJob], *, kind: str) -> list[tuple[JobRecord, HetSlurmJob]]:
    """Write each script to RUN/slurm/, sbatch it, record it, and return submitit handles."""
    paths.slurm.mkdir(parents=True, exist_ok=True)
    submitted = []
    submission = f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{len(read_records(paths)) + 1}"
    for job in jobs:
        script = paths.slurm / f"{submission}-{job.name}.sbatch"
        atomic_write_text(script, job.text)
        job_id = sbatch(script, cwd=paths.root)
        record = JobRecord(job_id=job_id, name=job.name, kind=kind, roles=roles_of(job, [job.name]),
                           script=str(script), submitted_at=time.time(), submission=submission)
        _append_record(paths, record)
        submitted.append((record, track(paths, job_id)))
    return submitted


def active_jobs(paths: RunPaths) -> list[tuple[JobRecord, str]]:
    """Known jobs that Slurm still runs or queues, with their state."""
    records = known_jobs(paths)
    states = query_states([r.job_id for r in records])
    return [(r, states[r.job_id][0]) for r in records
            if states.get(r.job_id) and states[r.job_id][0].split()[0] in ACTIVE_STATES]


def query_states(job_ids: tp.Sequence[str]) -> dict[str, list[str]]:
    """job id -> the state of each of its groups (index k = het group k): squeue's for a job it lists
    as active (slurmdbd lags: sacct showed a running het job as one PENDING row for ~4 s here),
    else sacct's, else squeue's."""
    if not job_ids:
        return {}
    states = _sacct_states(job_ids)
    for job_id, live in _squeue_states(job_ids).items():
        if job_id not in states or any(s.split()[0] in ACTIVE_STATES for s in live):
            states[job_id] = live
    return states


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _collect(rows: tp.Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    groups: dict[str, dict[int, str]] = {}
    for job_id, state in rows:
        match = _HET_ID.match(job_id)
        base, k = (match.group(1), int(match.group(2))) if match else (job_id, 0)
        groups.setdefault(base, {})[k] = state
    return {base: [g[k] for k in sorted(g)] for base, g in groups.items()}


def _sacct_states(job_ids: tp.Sequence[str]) -> dict[str, list[str]]:
    out = _run(["sacct", "-n", "-X", "-P", "-o", "JobID,State", "-j", ",".join(job_ids)])
    if out is None:
        return {}
    rows = [tuple(line.split("|")[:2]) for line in out.splitlines() if "|" in line]
    return _collect((a, b) for a, b in rows)


def _squeue_states(job_ids: tp.Sequence[str]) -> dict[str, list[str]]:
    out = _run(["squeue", "-h", "-o", "%i|%T", "-j", ",".join(job_ids)])
    if out is None:
        return {}
    rows = [tuple(line.split("|")[:2]) for line in out.splitlines() if "|" in line]
    return _collect((a, b) for a, b in rows)


def scancel(job_ids: tp.Sequence[str]) -> None:
    """scancel these jobs (every het group of each); SlurmError if scancel refuses."""
    if job_ids and _run(["scancel", *job_ids]) is None:
        raise SlurmError(f"scancel {' '.join(job_ids)} failed; check 'squeue -j {','.join(job_ids)}'")


def cancel_all(paths: RunPaths) -> list[str]:
    """scancel every recorded job that is still active; returns their ids."""
    ids = [r.job_id for r, _ in active_jobs(paths)]
    scancel(ids)
    return ids
