"""Slurm sizing: one typed group per role of the heterogeneous job (train, infer, rollout)."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section


@section
class GroupConfig:
    """One het group (one role) of the job."""

    partition: str = knob("", doc="Slurm partition ('' = the cluster default)", resumable=True)
    nodes: int = knob(1, doc="number of nodes in this group", min=0, resumable=True)
    ntasks_per_node: int = knob(1, doc="tasks (processes) per node; train: one per GPU", min=1, resumable=True)
    cpus_per_task: int = knob(1, doc="CPUs per task", min=1, resumable=True)
    mem_gb: float = knob(4.0, doc="memory per node in GiB", min=0.1, resumable=True)
    gpus_per_node: int = knob(0, doc="GPUs per node (GRES gpu)", min=0, resumable=True)
    sbatch_extra: list[str] = knob(
        factory=list, doc="extra '#SBATCH' options for this group, e.g. '--account=abc', '--qos=high'", resumable=True
    )
    setup: list[str] = knob(
        factory=list, doc="shell lines run before this group's step (module load, source venv)", resumable=True
    )
    python: str = knob("python3", doc="interpreter that runs spoolrl in this group", resumable=True)
    container: str = knob(
        "", doc="optional Apptainer image to run this group's step in ('' = none; GPUs via --nv)", resumable=True
    )
    drain_s: int = knob(
        120, doc="seconds this role needs to checkpoint or drain after Slurm's warning signal", min=10, max=65535,
        resumable=True,
    )


def _train_default() -> GroupConfig:
    return GroupConfig(partition="gpu", gpus_per_node=1, cpus_per_task=2, mem_gb=8.0, drain_s=300)


def _infer_default() -> GroupConfig:
    return GroupConfig(partition="gpu", gpus_per_node=1, cpus_per_task=2, mem_gb=8.0, drain_s=60)


def _rollout_default() -> GroupConfig:
    return GroupConfig(partition="cpu", cpus_per_task=2, mem_gb=4.0, drain_s=180)


@section
class SlurmConfig:
    """How the run is submitted to Slurm."""

    mode: Literal["het", "separate"] = knob(
        "het", doc="'het': one heterogeneous job; 'separate': one job per role on the same run dir", resumable=True
    )
    job_name: str = knob("spoolrl", doc="Slurm job name", resumable=True)
    time_limit_min: int = knob(60, doc="wall-clock limit of the job in minutes", min=1, resumable=True)
    requeue: bool = knob(True, doc="requeue the job after preemption or the warning signal", resumable=True)
    max_rollout_restarts: int = knob(
        3, doc="times the batch script restarts a rollout step that ended (its leased tasks are reclaimed)", min=0,
        resumable=True,
    )
    rollout_restart_delay_s: int = knob(
        10, doc="wait before restarting a rollout step (the batch script sleeps meanwhile, so it is kept short: "
        "a failing train or infer group still ends the job within a minute)", min=0, max=20, resumable=True,
    )
    stop_grace_s: int = knob(
        30, doc="when the job ends, seconds the remaining steps get to exit after SIGTERM (keeps a failed "
        "train or infer group from holding the job for more than a minute)", min=1, max=50, resumable=True,
    )
    train: GroupConfig = knob(factory=_train_default, doc="the training group (DeepSpeed ranks)")
    infer: GroupConfig = knob(factory=_infer_default, doc="the inference group (LLM servers)")
    rollout: GroupConfig = knob(factory=_rollout_default, doc="the rollout group (CPU sandboxes)")

    def check(self) -> list[str]:
        problems = []
        if self.train.nodes < 1:
            problems.append("train.nodes: the run needs at least 1 training node; set it to 1 or more")
        if self.infer.nodes < 1:
            problems.append("infer.nodes: the run needs at least 1 inference node; set it to 1 or more")
        for role, group in (("train", self.train), ("infer", self.infer), ("rollout", self.rollout)):
            for i, line in enumerate(group.sbatch_extra):
                if not line.startswith("-") or "\n" in line:
                    problems.append(f"{role}.sbatch_extra[{i}]: {line!r} must be one sbatch option such as "
                                    "'--account=abc' (one line, starting with '-')")
            if "\n" in group.container or "\n" in group.python:
                problems.append(f"{role}: python and container must be single-line values")
        min_time = max(self.train.drain_s, self.infer.drain_s, self.rollout.drain_s) // 60 + 1
        if self.time_limit_min <= min_time:
            problems.append(
                f"time_limit_min: {self.time_limit_min} leaves no time after the largest drain_s; "
                f"set it above {min_time}"
            )
        return problems
