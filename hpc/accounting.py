"""CPU- and GPU-hours per role of a run's Slurm jobs, from sacct (``ElapsedRaw`` x ``AllocTRES``)."""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Iterable
from typing import Any


def parse_tres(tres: str) -> dict[str, float]:
    """``cpu=4,gres/gpu=2,mem=8G,node=1`` -> {"cpu": 4, "gpu": 2, ...} (numbers only)."""
    out: dict[str, float] = {}
    for item in tres.split(","):
        key, _, value = item.partition("=")
        key = key.removeprefix("gres/")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out


def parse_sacct(text: str, roles_by_job: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """Rows ``JobID|ElapsedRaw|AllocTRES`` (het components as ``N+k``) -> hours per role."""
    hours: dict[str, dict[str, float]] = defaultdict(lambda: {"cpu_hours": 0.0, "gpu_hours": 0.0})
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 3 or not parts[1].isdigit():
            continue
        job, _, comp = parts[0].partition("+")
        roles = roles_by_job.get(job, [])
        k = int(comp) if comp.isdigit() else 0
        role = roles[k] if k < len(roles) else f"job{job}+{k}"
        tres = parse_tres(parts[2])
        seconds = float(parts[1])
        hours[role]["cpu_hours"] += seconds * tres.get("cpu", 0.0) / 3600.0
        hours[role]["gpu_hours"] += seconds * tres.get("gpu", 0.0) / 3600.0
    return dict(hours)


def slurm_group_hours(jobs: Iterable[Any]) -> dict[str, dict[str, float]]:
    """Hours per role for the run's job records (``job_id`` and ``roles``); empty if sacct fails."""
    roles_by_job = {str(j.job_id): list(j.roles) for j in jobs}
    if not roles_by_job:
        return {}
    cmd = ["sacct", "-X", "-P", "-n", "-o", "JobID,ElapsedRaw,AllocTRES", "-j", ",".join(roles_by_job)]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_sacct(out.stdout, roles_by_job) if out.returncode == 0 else {}
