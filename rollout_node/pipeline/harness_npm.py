"""``spoolrl harness install npm:PACKAGE --prefix DIR``: a harness published on npm (e.g. Codex CLI).

npm runs on the host (its configuration: registry, certificates, proxies) with ``--ignore-scripts`` and
installs ``PACKAGE`` into ``DIR/npm``. Each command of the package's ``bin`` becomes ``DIR/bin/NAME``, a
relative symbolic link (so it resolves wherever the prefix is mounted), to:

- the static native build the package vendors for this machine, ``vendor/<machine>-unknown-linux-musl/``
  ``bin/NAME`` or ``NAME/NAME``, in the package or one of its installed dependencies (how ``@openai/codex``
  ships its Rust binary: 0.171 in its platform package ``@openai/codex-linux-x64``, older releases in
  ``@openai/codex`` itself): it needs nothing from the image; or else
- the package's own launcher (``node_modules/.bin/NAME``), which needs Node.js in the image.

Guarantees: as for pip installs, the install is built next to DIR and renamed into place, so DIR is
absent or complete; ``DIR/spoolrl-harness.json`` records the spec, ``python`` ``none (npm)``, the
installed packages (``name==version``) and the commands.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

from hpc.errors import UsageError

NPM_SPEC = "npm:"
NPM_DIR = "npm"


def musl_triple() -> str:
    """The target triple of a static Linux build for this machine (``x86_64-unknown-linux-musl``)."""
    return f"{platform.machine()}-unknown-linux-musl"


def npm_install(package: str, root: Path, timeout_s: float) -> None:
    """``npm install PACKAGE`` into ``root`` (host network, no install scripts). Raises UsageError."""
    argv = ["npm", "install", "--prefix", str(root), "--no-save", "--no-audit", "--no-fund", "--ignore-scripts",
            "--loglevel=error", package]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except FileNotFoundError as exc:
        raise UsageError("harness install: npm:SPEC needs npm on this host's PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise UsageError(f"harness install: 'npm install {package}' took longer than {timeout_s:.0f} s") from exc
    if proc.returncode != 0:
        raise UsageError(f"harness install: npm could not install {package!r}:\n{(proc.stdout + proc.stderr)[-3000:]}")


def _package_dirs(modules: Path) -> list[Path]:
    """Every installed package directory under ``node_modules`` (scoped ones included)."""
    tops = [p for p in sorted(modules.iterdir()) if p.is_dir() and not p.name.startswith(".")]
    dirs = [q for p in tops for q in (sorted(p.iterdir()) if p.name.startswith("@") else [p])]
    return [d for d in dirs if (d / "package.json").is_file()]


def _manifest(package_dir: Path) -> dict[str, object]:
    data = json.loads((package_dir / "package.json").read_text())
    return data if isinstance(data, dict) else {}


def _requested(modules: Path, package: str) -> Path:
    """The directory of the package SPEC named (``@scope/name@version`` -> ``node_modules/@scope/name``)."""
    name = package[0] + package[1:].split("@", 1)[0]
    path = modules / name
    if not (path / "package.json").is_file():
        raise UsageError(f"harness install: npm installed no {name} under {modules}")
    return path


def _commands(package_dir: Path) -> list[str]:
    """The package's commands: its ``bin`` names (a single ``bin`` path is named after the package)."""
    meta = _manifest(package_dir)
    bins = meta.get("bin") or {}
    if isinstance(bins, str):
        return [str(meta.get("name", "")).rsplit("/", 1)[-1]]
    return sorted(str(name) for name in bins) if isinstance(bins, dict) else []


def _target(modules: Path, name: str) -> Path:
    """The static build vendored for this machine, else the package's Node launcher."""
    triple = musl_triple()
    for package_dir in _package_dirs(modules):
        for vendored in (f"vendor/{triple}/bin/{name}", f"vendor/{triple}/{name}/{name}"):
            if (package_dir / vendored).is_file():
                return package_dir / vendored
    return modules / ".bin" / name


def link_commands(build: Path, package: str) -> tuple[list[str], list[str]]:
    """``build/bin/NAME`` for each command of the installed package; returns (packages, commands)."""
    modules = build / NPM_DIR / "node_modules"
    commands = _commands(_requested(modules, package))
    if not commands:
        raise UsageError(f"harness install: {package!r} declares no commands (package.json 'bin')")
    (build / "bin").mkdir()
    for name in commands:
        target = _target(modules, name)
        os.symlink(os.path.relpath(target, build / "bin"), build / "bin" / name)
    packages = sorted(f"{m.get('name')}=={m.get('version')}" for m in map(_manifest, _package_dirs(modules)))
    return packages, commands
