"""How new policy weights reach running inference servers: a two-method seam (torch-free).

- :class:`PolicySource` says which policy is newest. :class:`RunDirPolicySource` reads
  ``RUN/policy/LATEST`` (the trainer writes it last, after the ``vNNNNNN/`` dir is complete).
- :class:`WeightTransport` pushes one policy into one server. :class:`DiskReload` (implemented)
  asks the server to load the published HF directory itself (``POST /reload``). A direct GPU to GPU
  transfer (vLLM's NCCL weight-transfer engine: ``/init_weight_transfer_engine`` +
  ``/update_weights``) would be a second implementation of the same seam.

Guarantee: a version is offered only when its directory holds a ``config.json`` (a published
policy dir is complete before LATEST names it; this guards against a hand-edited LATEST).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpc.errors import RecordError
from hpc.paths import RunPaths
from hpc.records import read_policy_latest


@dataclass(frozen=True)
class PolicyRef:
    version: int
    path: Path


class Reloadable(Protocol):
    def reload(self, path: Path, version: int) -> None: ...


class PolicySource(Protocol):
    def latest(self) -> PolicyRef | None: ...


class WeightTransport(Protocol):
    def push(self, server: Reloadable, ref: PolicyRef) -> None: ...


class RunDirPolicySource:
    def __init__(self, run_dir: str | Path) -> None:
        self.paths = RunPaths(Path(run_dir))

    def latest(self) -> PolicyRef | None:
        try:
            version = read_policy_latest(self.paths)
        except (OSError, RecordError):
            return None
        if version is None:
            return None
        path = self.paths.policy_version(version)
        return PolicyRef(version, path) if (path / "config.json").exists() else None


class DiskReload:
    """The server reads the published HF directory from the shared filesystem."""

    def push(self, server: Reloadable, ref: PolicyRef) -> None:
        server.reload(ref.path, ref.version)
