"""``SlurmEnv``: the one reader of ``SLURM_*`` variables in spoolrl.

Guarantees:
- Every other module asks this class; nothing else reads ``SLURM_*`` (tests feed it a dict).
- The het group of a task is derived, never guessed from ``SLURM_JOB_PARTITION`` (unreliable in
  het steps): a step spanning several groups (``srun --het-group=0,1``) numbers its tasks
  globally (``SLURM_PROCID`` runs over the cumulative ``SLURM_NTASKS_HET_GROUP_k``), a step of one
  group (``srun --het-group=1``, what spoolrl's batch script runs) numbers them from 0 and even
  shows the leader's ``SLURM_JOB_ID`` (measured on 22.05); both are resolved through the node
  lists, because components of one het job never share a node.
- Node lists are expanded from Slurm's compressed form (``gpu[01-03,7],cpu1``).
- The same code reads the variables of Slurm 22.05 (with the old ``*_PACK_*`` twins), 23.x and
  24.x; a variable that a version lacks degrades to the next source (e.g. remaining time falls
  back from ``SLURM_JOB_END_TIME`` to ``squeue``), never to a crash.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

_RANGE = re.compile(r"\[([^\]]*)\]")


def expand_hostlist(hostlist: str) -> list[str]:
    """``"gpu[01-02,5],cpu1"`` -> ``["gpu01", "gpu02", "gpu5", "cpu1"]`` (order kept, zero padding kept)."""
    return [host for part in _split_top(hostlist) for host in _expand_one(part)]


def _split_top(hostlist: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(hostlist):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(hostlist[start:i])
            start = i + 1
    parts.append(hostlist[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_one(pattern: str) -> list[str]:
    match = _RANGE.search(pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end():]
    return [head + item + rest for item in _expand_ranges(match.group(1)) for rest in _expand_one(tail)]


def _expand_ranges(spec: str) -> list[str]:
    out: list[str] = []
    for piece in spec.split(","):
        lo, sep, hi = piece.partition("-")
        if not sep:
            out.append(lo)
            continue
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(int(lo), int(hi) + 1))
    return out


def parse_slurm_duration(text: str) -> float | None:
    """squeue's ``%L``/``%l`` (``D-HH:MM:SS``, ``HH:MM:SS``, ``MM:SS``, ``SS``) -> seconds; None if unlimited/unknown."""
    text = text.strip()
    if not text or not text[0].isdigit():  # UNLIMITED, NOT_SET, INVALID, N/A
        return None
    days, _, clock = text.rpartition("-")
    fields = [int(x) for x in clock.split(":")]
    while len(fields) < 3:
        fields.insert(0, 0)
    hours, minutes, seconds = fields[-3:]
    return float((int(days or 0) * 24 + hours) * 3600 + minutes * 60 + seconds)


def _int(env: Mapping[str, str], name: str, default: int = 0) -> int:
    value = env.get(name, "")
    try:
        return int(value)
    except ValueError:
        return default


def _group_var(env: Mapping[str, str], stem: str, k: int) -> str | None:
    """``SLURM_<stem>_HET_GROUP_k``, or the pre-20.02 ``SLURM_<stem>_PACK_GROUP_k`` twin."""
    return env.get(f"SLURM_{stem}_HET_GROUP_{k}", env.get(f"SLURM_{stem}_PACK_GROUP_{k}"))


@dataclass(frozen=True)
class SlurmEnv:
    """What a process learns from Slurm's environment (see the module docstring)."""

    env: Mapping[str, str]

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> SlurmEnv:
        source = os.environ if env is None else env
        return cls({k: v for k, v in source.items() if k.startswith(("SLURM_", "SLURMD_"))})

    # ---------------------------------------------------------------- identity
    @property
    def in_slurm(self) -> bool:
        return "SLURM_JOB_ID" in self.env

    @property
    def in_step(self) -> bool:
        """True inside an srun task (the batch shell itself is not a step)."""
        return "SLURM_STEP_ID" in self.env or "SLURM_STEPID" in self.env

    @property
    def job_id(self) -> str:
        """The job id users see: the het leader's id in every component ('' outside Slurm)."""
        leader = _group_var(self.env, "JOB_ID", 0)
        return leader or self.env.get("SLURM_JOB_ID", "")

    @property
    def restart_count(self) -> int:
        return _int(self.env, "SLURM_RESTART_COUNT")

    @property
    def node_name(self) -> str:
        return self.env.get("SLURMD_NODENAME", "")

    @property
    def num_het_groups(self) -> int:
        return _int(self.env, "SLURM_HET_SIZE", _int(self.env, "SLURM_PACK_SIZE", 1)) or 1

    # ---------------------------------------------------------------- groups and ranks
    def group_ntasks(self, group: int) -> int:
        value = _group_var(self.env, "NTASKS", group)
        if value is None and self.num_het_groups == 1:
            value = self.env.get("SLURM_NTASKS", "1")
        return int(value or 0)

    def group_nodes(self, group: int) -> list[str]:
        value = _group_var(self.env, "JOB_NODELIST", group)
        if value is None and self.num_het_groups == 1:
            value = self.env.get("SLURM_JOB_NODELIST", self.env.get("SLURM_NODELIST", ""))
        return expand_hostlist(value or "")

    def _spans_groups(self) -> bool:
        """True when this step's tasks are numbered across all het groups (``--het-group=0,1,..``)."""
        total = sum(self.group_ntasks(k) for k in range(self.num_het_groups))
        return self.num_het_groups > 1 and _int(self.env, "SLURM_NTASKS", -1) == total

    @property
    def het_group(self) -> int:
        """Index of this task's het group (0 outside het jobs).

        Slurm never places two components of one het job on the same node, so the group whose node
        list holds this task's node is the answer; this also covers a step of a single group, where
        every variable (even SLURM_JOB_ID) looks like the leader's. Without a node name, a step
        across all groups is resolved from SLURM_PROCID and the cumulative task counts."""
        if self.num_het_groups == 1:
            return 0
        node = self.node_name
        for k in range(self.num_het_groups):
            if node and node in self.group_nodes(k):
                return k
        if not self._spans_groups():
            return 0
        procid, start = self.procid, 0
        for k in range(self.num_het_groups):
            start += self.group_ntasks(k)
            if procid < start:
                return k
        raise AssertionError(f"SLURM_PROCID {procid} beyond the het groups' {start} tasks")

    @property
    def procid(self) -> int:
        return _int(self.env, "SLURM_PROCID")

    @property
    def group_rank(self) -> int:
        """Rank of this task within its het group (0..group_size-1)."""
        if not self._spans_groups():
            return self.procid
        return self.procid - sum(self.group_ntasks(k) for k in range(self.het_group))

    @property
    def group_size(self) -> int:
        if not self._spans_groups() and "SLURM_NTASKS" in self.env:
            return _int(self.env, "SLURM_NTASKS", 1)
        return self.group_ntasks(self.het_group)

    @property
    def node_index(self) -> int:
        """Index of this node within the step (``SLURM_NODEID``): 0 on the step's first node."""
        return _int(self.env, "SLURM_NODEID")

    @property
    def local_rank(self) -> int:
        return _int(self.env, "SLURM_LOCALID")

    # ---------------------------------------------------------------- time
    def end_time(self, *, squeue: bool = True) -> float | None:
        """Unix time at which Slurm ends the job; None if unlimited or unknown."""
        value = _int(self.env, "SLURM_JOB_END_TIME", 0)
        if value > 0:
            return float(value)
        left = self._squeue_time_left() if squeue else None
        return None if left is None else time.time() + left

    def remaining_s(self, *, now: float | None = None, squeue: bool = True) -> float | None:
        """Seconds until the time limit (None if unlimited or unknown; never negative)."""
        end = self.end_time(squeue=squeue)
        if end is None:
            return None
        return max(0.0, end - (time.time() if now is None else now))

    def _squeue_time_left(self) -> float | None:
        if not self.job_id:
            return None
        try:
            out = subprocess.run(["squeue", "-h", "-j", self.job_id, "-o", "%L"], capture_output=True,
                                 text=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = out.stdout.split()
        return parse_slurm_duration(lines[0]) if out.returncode == 0 and lines else None

    # ---------------------------------------------------------------- rendezvous
    @property
    def tasks_on_node(self) -> int:
        """Tasks of this step on this node (``SLURM_STEP_TASKS_PER_NODE`` like ``2(x3)``; first entry)."""
        value = self.env.get("SLURM_STEP_TASKS_PER_NODE", self.env.get("SLURM_TASKS_PER_NODE", "1"))
        return int(value.split(",")[0].split("(")[0] or 1)

    def distributed_env(self, group: int = 0) -> dict[str, str]:
        """torch.distributed ``env://`` variables for a task of ``group``'s step (the train group)."""
        host, port = self.rendezvous(group)
        return {"MASTER_ADDR": host, "MASTER_PORT": str(port), "RANK": str(self.group_rank),
                "WORLD_SIZE": str(self.group_size), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.tasks_on_node)}

    def rendezvous(self, group: int = 0, *, port_base: int = 20000, port_span: int = 20000) -> tuple[str, int]:
        """(host, port) for torch.distributed: the first node of ``group``; the port comes from the
        job id and the restart count, so a requeued job does not collide with a lingering old one."""
        nodes = self.group_nodes(group)
        host = nodes[0] if nodes else "127.0.0.1"
        digits = re.sub(r"\D", "", self.job_id) or "0"
        port = port_base + (int(digits) * 17 + self.restart_count) % port_span
        return host, port
