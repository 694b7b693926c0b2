"""Default worker counts of the three stages, from the node's allocation and free scratch space.

Inputs: CPUs (the CPUs this process may run on, which inside a Slurm step is the job's cpuset),
memory (the node's MemTotal) and free space on node-local scratch. A configured count (> 0) always wins. The heuristic, per stage:

- INIT (git checkout, image staging: I/O bound): ``min(4, cpus // 4 + 1)``.
- RUN (waits on the LLM most of the time; holds one live sandbox): ``min(8 * cpus, mem_gb /
  (sandbox.mem_gb / 4))`` - an idle agent sandbox uses about a quarter of its memory limit.
- EVAL (runs test suites: CPU bound; one live sandbox each): ``max(1, cpus // 2)``.

Every stage is also capped by ``free scratch / rollout.scratch_per_episode_gb`` (each episode in
INIT or RUN holds one work dir), so a burst of INITs never fills the disk.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from hpc.config import RolloutConfig, SandboxConfig


@dataclass(frozen=True)
class Workers:
    init: int
    run: int
    eval: int


def node_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def node_mem_gb() -> float:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 4.0


def free_scratch_gb(scratch: Path) -> float:
    scratch.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(scratch).free / 2**30


def default_workers(rollout: RolloutConfig, sandbox: SandboxConfig, scratch: Path) -> Workers:
    """Worker counts per stage (see the module docstring); configured values win."""
    cpus, mem_gb = node_cpus(), node_mem_gb()
    by_disk = max(1, int(free_scratch_gb(scratch) / rollout.scratch_per_episode_gb))
    init = min(4, cpus // 4 + 1, by_disk)
    run = min(8 * cpus, max(1, int(mem_gb / (sandbox.mem_gb / 4))), by_disk)
    evals = min(max(1, cpus // 2), by_disk)
    return Workers(init=rollout.init_workers or max(1, init), run=rollout.run_workers or max(1, run),
                   eval=rollout.eval_workers or max(1, evals))
