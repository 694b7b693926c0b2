"""Rules across sections that would otherwise fail only after the queue wait (pure: no I/O).

Each function takes the whole :class:`~hpc.config.RunConfig` and returns problems as
``"dotted.key: what is wrong; the fix"`` strings; :meth:`RunConfig.check` collects them.

Guarantees:
- ``tasks.source`` names a built-in set or a ``.jsonl`` file: a typo of a built-in name is refused
  with the closest name, not read as a file that no node has.
- ``model.path`` is not empty (an empty path is the current directory: ``init`` would hash it).
- A step can be filled: the feeder keeps at most ``trainer.max_tasks_outstanding`` tasks issued and
  not yet resolved, and a task stays outstanding until its group is trained (or dropped), so fewer
  than ``algorithm.groups_per_step`` outstanding tasks is a trainer that waits forever.
- No ``slurm.<group>.sbatch_extra`` option repeats (or contradicts) an option the renderer writes
  from a config key (``--gres``, ``--mem``, ``--time`` ...): the error names that key.
- :func:`job_problems` (for the verbs that render or submit a run's job, not for every config: the
  renderer itself can draw a job without rollout nodes) refuses ``slurm.rollout.nodes: 0``, a job
  whose trainer waits for trajectories nothing produces.
"""

from __future__ import annotations

import difflib
import typing as tp

from hpc.config.tasks import BUILTIN_TASK_SETS

if tp.TYPE_CHECKING:
    from hpc.config import RunConfig
    from hpc.config.slurm import GroupConfig

# sbatch options the renderer writes (hpc.render: job and group options) -> the config key that sets
# them. Short forms map to their long names.
RENDERED_OPTIONS = {
    "--partition": "partition", "--nodes": "nodes", "--ntasks": "ntasks_per_node",
    "--ntasks-per-node": "ntasks_per_node", "--cpus-per-task": "cpus_per_task", "--mem": "mem_gb",
    "--mem-per-cpu": "mem_gb", "--mem-per-gpu": "mem_gb", "--gpus": "gpus_per_node",
    "--gpus-per-node": "gpus_per_node", "--gpus-per-task": "gpus_per_node", "--signal": "drain_s",
    "--job-name": "slurm.job_name", "--time": "slurm.time_limit_min", "--output": "", "--error": "",
    "--open-mode": "", "--requeue": "slurm.requeue", "--no-requeue": "slurm.requeue",
}  # "": fixed by the renderer (logs go to RUN/logs), no key sets it
SHORT_OPTIONS = {"-p": "--partition", "-N": "--nodes", "-n": "--ntasks", "-c": "--cpus-per-task",
                 "-G": "--gpus", "-J": "--job-name", "-t": "--time", "-o": "--output", "-e": "--error"}


def task_source_problems(config: RunConfig) -> list[str]:
    source = config.tasks.source
    if source in BUILTIN_TASK_SETS or source.endswith(".jsonl"):
        return []
    close = difflib.get_close_matches(source, list(BUILTIN_TASK_SETS), n=1, cutoff=0.6)
    fix = f"did you mean '{close[0]}'?" if close else "give one of those"
    names = ", ".join(repr(n) for n in BUILTIN_TASK_SETS)
    return [f"tasks.source: {source!r} is neither a built-in set ({names}) nor a JSONL file (a path ending in "
            f".jsonl); {fix}"]


def model_problems(config: RunConfig) -> list[str]:
    if config.model.path.strip():
        return []
    return ["model.path: empty; give a Hugging Face model directory (or 'tiny' for the built-in tiny model)"]


def feed_problems(config: RunConfig) -> list[str]:
    outstanding, per_step = config.trainer.max_tasks_outstanding, config.algorithm.groups_per_step
    if outstanding >= per_step:
        return []
    return [f"trainer.max_tasks_outstanding: {outstanding} is below algorithm.groups_per_step ({per_step}): a task "
            f"stays outstanding until its group is trained, so a step of {per_step} groups could never be filled "
            f"and the trainer would wait forever; set max_tasks_outstanding to at least {per_step}"]


def option_name(line: str) -> str:
    """``--gres=gpu:4`` -> ``--gres``; ``-N 2`` / ``-N2`` -> ``--nodes``."""
    if line.startswith("--"):
        return line.split("=", 1)[0].split(None, 1)[0]
    return SHORT_OPTIONS.get(line[:2], line[:2])


def _rendered_key(name: str, line: str, group: GroupConfig) -> str | None:
    """The config key behind a rendered option ``line`` repeats, or None if the renderer writes no such option."""
    if name == "--gres":
        return "gpus_per_node" if group.gpus_per_node or "gpu" in line else None
    return RENDERED_OPTIONS.get(name)


def sbatch_extra_problems(config: RunConfig) -> list[str]:
    problems = []
    for role in ("train", "infer", "rollout"):
        group: GroupConfig = getattr(config.slurm, role)
        for i, line in enumerate(group.sbatch_extra):
            name = option_name(line)
            key = _rendered_key(name, line, group)
            if key is None:
                continue
            where = key if key.startswith("slurm.") else f"slurm.{role}.{key}"
            fix = f"and set {where} instead" if key else "(the renderer's value is fixed: logs go to RUN/logs)"
            problems.append(f"slurm.{role}.sbatch_extra[{i}]: {line!r} repeats {name}, which the rendered script "
                            f"already writes; remove it from sbatch_extra {fix}")
    return problems


CHECKS = (task_source_problems, model_problems, feed_problems, sbatch_extra_problems)


def cross_section_problems(config: RunConfig) -> list[str]:
    """Every rule of this module, in order."""
    return [p for check in CHECKS for p in check(config)]


def job_problems(config: RunConfig) -> list[str]:
    """What makes a run's submitted job useless, though the config itself is consistent."""
    if config.slurm.rollout.nodes > 0:
        return []
    return ["slurm.rollout.nodes: 0 renders a job without rollout nodes: nothing would produce trajectories and "
            "the trainer would wait until the time limit; set it to 1 or more (more join later with 'spoolrl scale')"]
