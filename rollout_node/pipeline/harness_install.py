"""``spoolrl harness install SPEC --prefix DIR``: a self-contained harness install for the sandboxes.

Two steps, so that the network is needed only on the host and the install is made by the sandbox
image's own Python (the one that runs it in every episode, under bwrap or apptainer):

1. on the host, ``pip wheel SPEC`` (the host's pip configuration: indexes, certificates, proxies)
   collects SPEC and every dependency as wheels (a local directory or sdist is built into one);
2. in a sandbox on the image (no network), the image's ``python3 -m venv --without-pip`` makes a
   virtual environment at :data:`~hpc.config.rollout.HARNESS_INSIDE`, and pip (the host's pure-Python
   pip package, mounted read-only) installs exactly those wheels into it, offline.

Guarantees: the venv's interpreter is the image's ``/usr/bin/python3`` and every console script's
``#!`` line names :data:`HARNESS_INSIDE`, so the install works wherever the prefix is mounted there
(every harness episode mounts ``rollout.harness.prefix`` read-only at that path); it does not run on
the host. The install is built next to DIR and renamed into place at the end, so DIR is either absent
or complete; an existing DIR is refused. ``DIR/spoolrl-harness.json`` records the spec, the image's
Python version, the installed distributions and the console scripts.

``npm:PACKAGE`` (e.g. ``npm:@openai/codex@0.171.0``) installs an npm package instead, with npm on the host
and no sandbox (:mod:`rollout_node.pipeline.harness_npm`): its commands go to ``DIR/bin``, as the
static native build the package vendors when it has one.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from hpc.config.rollout import HARNESS_INSIDE
from hpc.config.sandbox import SandboxConfig
from hpc.errors import SandboxError, UsageError
from rollout_node.pipeline.harness_npm import NPM_DIR, NPM_SPEC, link_commands, npm_install
from rollout_node.sandbox.runtimes import Bind

if TYPE_CHECKING:
    from rollout_node.sandbox.sandbox import Sandbox

MANIFEST = "spoolrl-harness.json"
PIP_INSIDE = "/run/spoolrl/pip"
WHEELS_INSIDE = "/run/spoolrl/wheels"
INSTALL_TIMEOUT_S = 900.0
# in the sandbox: the console scripts of every installed distribution, and the interpreter's version
_LIST_SCRIPT = """import importlib.metadata as m, json, sys
dists = sorted({(d.metadata["Name"], d.version) for d in m.distributions()})
scripts = sorted({e.name for d in m.distributions() for e in d.entry_points if e.group == "console_scripts"})
print(json.dumps({"python": "%d.%d" % sys.version_info[:2], "distributions": [f"{n}=={v}" for n, v in dists],
                  "console_scripts": scripts}))
"""


@dataclass(frozen=True)
class InstallManifest:
    """What ``DIR/spoolrl-harness.json`` records."""

    spec: str
    python: str
    distributions: list[str]
    console_scripts: list[str]

    @classmethod
    def read(cls, prefix: Path) -> InstallManifest:
        path = prefix / MANIFEST
        try:
            data = json.loads(path.read_text())
            return cls(str(data["spec"]), str(data["python"]), [str(d) for d in data["distributions"]],
                       [str(s) for s in data["console_scripts"]])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{prefix}: not a harness install ({path}: {exc}); make one with "
                             "'spoolrl harness install SPEC --prefix DIR'") from exc


def check_prefix(prefix: str) -> list[str]:
    """Why ``rollout.harness.prefix`` cannot be used on this machine ('' problems = it can)."""
    root = Path(prefix)
    if not (root / MANIFEST).is_file():
        return [f"rollout.harness.prefix: {prefix} holds no harness install ({MANIFEST} missing); make one with "
                f"'spoolrl harness install SPEC --prefix {prefix}'"]
    if not (root / "bin").is_dir():
        return [f"rollout.harness.prefix: {prefix}/bin is missing; reinstall with 'spoolrl harness install'"]
    return []


def _local_spec(spec: str) -> Path | None:
    """SPEC names a local directory or file (pip builds it on the host)."""
    path = Path(spec).expanduser()
    return path.resolve() if (path.exists() and ("/" in spec or spec.startswith("."))) else None


def collect_wheels(spec: str, wheels: Path, timeout_s: float = INSTALL_TIMEOUT_S) -> None:
    """Step 1 (host): SPEC and its dependencies as wheels in ``wheels``; a local directory is built from a
    copy next to ``wheels`` (pip builds in the tree: the user's directory stays as it was). Raises UsageError."""
    local = _local_spec(spec)
    if local is not None and local.is_dir():
        local = Path(shutil.copytree(local, wheels.parent / "source", symlinks=True))
    argv = [sys.executable, "-m", "pip", "wheel", "--quiet", "--wheel-dir", str(wheels), str(local or spec)]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise UsageError(f"harness install: 'pip wheel {spec}' took longer than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise UsageError(f"harness install: pip could not collect {spec!r} (is it a requirement pip accepts, "
                         f"and the index reachable?):\n{(proc.stdout + proc.stderr)[-3000:]}")


def _image_python(sb: Sandbox) -> str:
    result = sb.exec(["/usr/bin/python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout_s=60.0)
    if result.exit_code != 0:
        raise SandboxError(f"the image has no usable /usr/bin/python3: {result.output[-500:]}")
    return str(result.output).strip()


def _new_prefix(prefix: Path) -> Path:
    """``--prefix`` made absolute, its parent created; refused when it exists or has a bind separator."""
    prefix = prefix.expanduser().absolute()
    if prefix.exists():
        raise UsageError(f"--prefix {prefix}: already exists; remove it or choose another directory")
    if any(c in str(prefix) for c in ",:"):
        raise UsageError(f"--prefix {prefix}: ',' and ':' are separators in apptainer's --bind; choose a path without them")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    return prefix


def _commit(build: Path, prefix: Path, manifest: InstallManifest) -> None:
    """Publish a finished build: its manifest written, then the whole directory renamed onto ``prefix`` (on the
    same filesystem, so a reader sees no install or all of it)."""
    (build / MANIFEST).write_text(json.dumps(asdict(manifest), indent=1) + "\n")
    os.chmod(build, 0o755)
    os.replace(build, prefix)


def install_npm(spec: str, prefix: Path, timeout_s: float = INSTALL_TIMEOUT_S) -> InstallManifest:
    """``npm:PACKAGE`` at ``prefix`` (:mod:`rollout_node.pipeline.harness_npm`): npm on the host, no sandbox."""
    package = spec.removeprefix(NPM_SPEC)
    with tempfile.TemporaryDirectory(prefix=f".{prefix.name}.", dir=prefix.parent) as tmp:
        build = Path(tmp) / "prefix"
        npm_install(package, build / NPM_DIR, timeout_s)
        packages, commands = link_commands(build, package)
        manifest = InstallManifest(spec, "none (npm)", packages, commands)
        _commit(build, prefix, manifest)
    return manifest


def install(spec: str, prefix: Path, sandbox: SandboxConfig, *, image: str | None = None,
            timeout_s: float = INSTALL_TIMEOUT_S) -> InstallManifest:
    """Build the install of ``spec`` at ``prefix`` (see the module docstring). Raises UsageError, SandboxError."""
    from rollout_node.sandbox import open_sandbox

    prefix = _new_prefix(prefix)
    if spec.startswith(NPM_SPEC):
        return install_npm(spec, prefix, timeout_s)
    with tempfile.TemporaryDirectory(prefix=f".{prefix.name}.", dir=prefix.parent) as tmp:
        build, wheels, work = Path(tmp) / "prefix", Path(tmp) / "wheels", Path(tmp) / "work"
        for d in (build, wheels, work):
            d.mkdir()
        collect_wheels(spec, wheels, timeout_s)
        pip_dir = Path(str(__import__("pip").__file__)).parent
        binds = (Bind(build, HARNESS_INSIDE, writable=True), Bind(wheels, WHEELS_INSIDE),
                 Bind(pip_dir, f"{PIP_INSIDE}/pip"))
        script = (f"/usr/bin/python3 -m venv --without-pip {HARNESS_INSIDE} && "
                  f"PYTHONPATH={PIP_INSIDE} {HARNESS_INSIDE}/bin/python -m pip install --quiet --no-index --no-deps "
                  f"--no-cache-dir --disable-pip-version-check {WHEELS_INSIDE}/*.whl && "
                  f"{HARNESS_INSIDE}/bin/python -c {shlex.quote(_LIST_SCRIPT)}")
        with open_sandbox(sandbox, work, image=image) as sb:
            host_python = f"{sys.version_info[0]}.{sys.version_info[1]}"
            if (inside := _image_python(sb)) != host_python:
                raise UsageError(f"harness install: the image's python is {inside} but this host's is {host_python}; "
                                 f"wheels must match the image: run spoolrl with a python {inside}")
            result = sb.exec(["/bin/sh", "-c", script], timeout_s=timeout_s, binds=binds)
        if result.exit_code != 0:
            raise SandboxError(f"harness install: installing the wheels in the sandbox failed "
                               f"(exit {result.exit_code}):\n{result.output[-3000:]}")
        listing = json.loads(str(result.output).strip().splitlines()[-1])
        manifest = InstallManifest(spec, listing["python"], listing["distributions"], listing["console_scripts"])
        _commit(build, prefix, manifest)
    return manifest

