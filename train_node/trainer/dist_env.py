"""Where this trainer process sits in the train group: rank, world size, rendezvous.

Resolution order (first that applies):
1. torchrun / deepspeed launcher variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
   ``MASTER_PORT``) when they are set: the launcher knows best.
2. ``hpc.slurm_env.SlurmEnv`` under a Slurm job step (srun starts one task per GPU): train-group
   rank and size, the first host of the train group and a port derived from the job id and the
   restart count (so a requeued job never collides with its predecessor's port).
3. A single process on this host: ``MASTER_PORT`` if set, else a port the OS has free now (a fixed
   default would collide with any other single trainer on the host: two demos, a demo and a test);
   ``port_picked`` says so, and :func:`train_node.trainer.engine.init_distributed` picks another one
   when a process took it before the rendezvous bound it.

``deepspeed.init_distributed`` (torch's ``env://``) reads the rendezvous from the environment:
:meth:`DistEnv.exported` puts ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` there for the
rendezvous only and restores them after, so nothing this process starts later (a role spawned by a test
that ran a trainer in-process) takes them for a launcher's. ``LOCAL_RANK`` is the one variable set for
good (:meth:`DistEnv.export_local_rank`): DeepSpeed reads it for the engine's whole life (its
construction, ZeRO-3's parameter fetches, checkpoint saves), and it alone makes no launcher's environment.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hpc.slurm_env import SlurmEnv

RENDEZVOUS_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    source: str  # "launcher", "slurm" or "single"
    port_picked: bool = False  # master_port is the OS's pick of a moment ago (another one may be tried)

    def rendezvous_vars(self) -> dict[str, str]:
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}

    @contextmanager
    def exported(self) -> Iterator[None]:
        """The rendezvous variables in ``os.environ`` within the block; afterwards as they were (unset if unset)."""
        before = {key: os.environ.get(key) for key in RENDEZVOUS_VARS}
        os.environ.update(self.rendezvous_vars())
        try:
            yield
        finally:
            for key, value in before.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def export_local_rank(self) -> None:
        """``LOCAL_RANK`` for DeepSpeed, for the rest of the process (see the module docstring)."""
        os.environ["LOCAL_RANK"] = str(self.local_rank)


def _from_launcher(env: dict[str, str]) -> DistEnv | None:
    if "RANK" not in env or "WORLD_SIZE" not in env:
        return None
    return DistEnv(
        rank=int(env["RANK"]), local_rank=int(env.get("LOCAL_RANK", "0")), world_size=int(env["WORLD_SIZE"]),
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=int(env.get("MASTER_PORT", "29500")),
        source="launcher",
    )


def _from_slurm(env: dict[str, str]) -> DistEnv | None:
    se = SlurmEnv.from_environ(env)
    if not (se.in_slurm and se.in_step):
        return None
    host, port = se.rendezvous(se.het_group)
    return DistEnv(rank=se.group_rank, local_rank=se.local_rank, world_size=se.group_size,
                   master_addr=host, master_port=port, source="slurm")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's pick)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def resolve(environ: dict[str, str] | None = None) -> DistEnv:
    env = dict(os.environ if environ is None else environ)
    found = _from_launcher(env) or _from_slurm(env)
    if found is not None:
        return found
    if env.get("MASTER_PORT"):
        return DistEnv(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1",
                       master_port=int(env["MASTER_PORT"]), source="single")
    return DistEnv(rank=0, local_rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port(),
                   source="single", port_picked=True)
