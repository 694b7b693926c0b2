"""One class builds every path inside a run directory (layout in DESIGN.md).

Only what must be shared or survive lives in the run directory; sandboxes, checkouts and
sockets go to node-local scratch (see :func:`node_scratch`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

LAYOUT_VERSION = 1
TINY_MODEL = "tiny"  # model.path that builds a tiny random model into RUN/model (tests and the demo)


@dataclass(frozen=True)
class RunPaths:
    """Paths of one run directory. Pure: building a path touches nothing on disk."""

    root: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root).absolute())

    @property
    def run_yaml(self) -> Path:
        return self.root / "run.yaml"

    @property
    def layout_file(self) -> Path:
        return self.root / ".spoolrl-layout"

    @property
    def spool(self) -> Path:
        return self.root / "spool"

    @property
    def policy(self) -> Path:
        return self.root / "policy"

    def policy_version(self, version: int) -> Path:
        return self.policy / f"v{version:06d}"

    @property
    def policy_latest(self) -> Path:
        return self.policy / "LATEST"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def checkpoint_latest(self) -> Path:
        return self.checkpoints / "LATEST"

    @property
    def endpoints(self) -> Path:
        return self.root / "endpoints"

    @property
    def control(self) -> Path:
        return self.root / "control"

    @property
    def stop_marker(self) -> Path:
        return self.control / "STOP"

    @property
    def secret(self) -> Path:
        return self.control / "secret"

    @property
    def trainer_waiting(self) -> Path:
        """Present while the trainer waits for samples (:class:`hpc.records.TrainerWaiting`)."""
        return self.control / "TRAINER_WAITING"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def model(self) -> Path:
        """Where 'model.path: tiny' builds the initial model."""
        return self.root / "model"

    def model_dir(self, model_path: str) -> Path:
        """The directory ``model.path`` names: ``tiny`` is :attr:`model`, anything else is itself."""
        return self.model if model_path == TINY_MODEL else Path(model_path)

    def tokenizer_dir(self, model_path: str, tokenizer_path: str = "") -> Path:
        """``model.tokenizer_path`` when set, else the model's directory."""
        return Path(tokenizer_path) if tokenizer_path else self.model_dir(model_path)

    @property
    def repos(self) -> Path:
        """Built-in task repositories (a bare mirror per repository)."""
        return self.root / "repos"

    @property
    def slurm(self) -> Path:
        """Rendered job scripts and submitit folders."""
        return self.root / "slurm"

    def directories(self) -> list[Path]:
        return [self.spool, self.policy, self.checkpoints, self.endpoints, self.control, self.logs,
                self.metrics, self.slurm]


def node_scratch(configured: str = "") -> Path:
    """Node-local scratch: the configured dir, else $TMPDIR, else the system temp dir."""
    return Path(configured or os.environ.get("TMPDIR") or tempfile.gettempdir())


def private_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) or accept an existing one only if it is ours and safe.

    Node-local scratch usually sits in a /tmp that every user of the node shares, under a name
    others can predict. A directory (or symlink) planted there by another user would hand them our
    image cache, work dirs and sockets, so an existing entry must be a real directory owned by this
    uid that nobody else can write; one that others can only read is tightened to 0700. Raises
    PermissionError naming the path and the problem otherwise.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    problem = ("is not a directory (a symlink or file planted there?)" if not stat.S_ISDIR(st.st_mode) else
               f"is owned by uid {st.st_uid}, not by this user (uid {os.getuid()})" if st.st_uid != os.getuid() else
               f"is writable by others (mode {stat.S_IMODE(st.st_mode):04o})" if st.st_mode & 0o022 else "")
    if problem:
        raise PermissionError(f"{path} {problem}; refusing to use it as private scratch. Remove it, or set "
                              "sandbox.scratch_dir (or $TMPDIR) to a directory of your own")
    if stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path
