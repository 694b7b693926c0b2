"""Sandbox settings: runtime, image, node-local scratch and per-episode limits."""

from __future__ import annotations

from typing import Literal

from hpc.config.base import knob, section

BIND_SEPARATORS = (",", ":")  # apptainer --bind src[:dst[:opts]][,...]: no escaping exists


@section
class SandboxConfig:
    """Where and how agent episodes run (rootless)."""

    runtime: Literal["bwrap", "apptainer", "local"] = knob(
        "bwrap", doc="sandbox runtime; 'local' gives NO isolation and also needs allow_local: true"
    )
    allow_local: bool = knob(False, doc="explicit opt-in for runtime: local (no isolation at all)")
    image: str = knob(
        "", doc="image: a root filesystem directory or a .sif; '' = the project's test image (scripts/build_image.sh)"
    )
    scratch_dir: str = knob("", doc="node-local scratch for work dirs and sockets ('' = $TMPDIR or /tmp)",
                            resumable=True)
    image_cache_gb: float = knob(20.0, doc="disk budget of the per-node image cache (LRU eviction)", min=0.1,
                                 resumable=True)
    image_cache_dir: str = knob("", doc="per-node image cache ('' = <scratch_dir>/spoolrl-<uid>/images)", resumable=True)
    mem_gb: float = knob(4.0, doc="memory limit per episode (RLIMIT_AS and the watchdog's tree sum)", min=0.1)
    cpu_time_s: int = knob(3600, doc="CPU-time limit per sandbox process (RLIMIT_CPU)", min=1)
    max_procs: int = knob(256, doc="process limit per sandbox (watchdog; RLIMIT_NPROC counts the whole uid)", min=4)
    max_file_mb: int = knob(1024, doc="largest file a sandbox may write (RLIMIT_FSIZE)", min=1)
    tmp_mb: int = knob(512, doc="size of the sandbox's /tmp tmpfs (bwrap; counts as memory of the node)", min=1)
    command_timeout_s: float = knob(60.0, doc="default timeout of one bash tool call", min=0.1)
    max_output_kb: int = knob(64, doc="tool output kept per call (head and tail), the rest is counted", min=1)

    def check(self) -> list[str]:
        if self.runtime == "local" and not self.allow_local:
            return ["runtime: 'local' runs agent code with NO isolation; set sandbox.allow_local: true to accept "
                    "that, or use runtime: bwrap"]
        if self.runtime == "apptainer" and any(c in self.scratch_dir for c in BIND_SEPARATORS):
            return [f"scratch_dir: {self.scratch_dir!r} contains ',' or ':', which apptainer's --bind and --overlay "
                    "read as separators (work dirs live under it); choose a path without them"]
        return []
