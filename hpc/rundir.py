"""Creating and opening run directories, with provenance and resume checks.

Guarantees:
- ``create_run`` validates first (the config is already a typed ``RunConfig``), then creates the
  layout and writes ``run.yaml`` (the resolved config + provenance) atomically, last of all, so
  a half-created run never looks complete. The run directory and its top-level directories are
  mode 0700 whatever the umask (the secret, endpoint files, shards and checkpoints are trusted).
- ``open_run`` checks the layout version and returns the frozen config.
- ``check_resume`` refuses a changed config except for keys documented as safe to change
  (``knob(resumable=True)``: cluster sizing, concurrency, time limits) and names the key; a
  rendered job runs it against the config it embeds before it starts anything.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import secrets
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from hpc import __version__
from hpc.config import RunConfig, config_from_dict, iter_fields, to_dict
from hpc.errors import RunDirError
from hpc.fsutil import atomic_write_text
from hpc.paths import LAYOUT_VERSION, RunPaths

PROVENANCE_PACKAGES = ("torch", "deepspeed", "transformers", "tokenizers", "vllm", "submitit", "pyarrow", "numpy")


def _git_sha() -> str | None:
    here = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def _package_versions() -> dict[str, str]:
    versions = {}
    for name in PROVENANCE_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def dir_hash(path: Path) -> str | None:
    """sha256 over the names and bytes of the files directly in ``path`` (a model or tokenizer dir)."""
    if not path.is_dir():
        return None
    h = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def provenance(config: RunConfig, paths: RunPaths) -> dict[str, Any]:
    model = paths.model_dir(config.model.path)
    tok = paths.tokenizer_dir(config.model.path, config.model.tokenizer_path)
    return {
        "spoolrl_version": __version__,
        "git_sha": _git_sha(),
        "packages": _package_versions(),
        "model_hash": dir_hash(model),
        "tokenizer_hash": dir_hash(tok),
        "layout_version": LAYOUT_VERSION,
    }


def config_digest(config: RunConfig) -> str:
    """``sha256:<hex>`` of the resolved config (canonical JSON): what a rendered script records."""
    text = json.dumps(to_dict(config), sort_keys=True, separators=(",", ":"), allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def render_run_yaml(config: RunConfig, prov: dict[str, Any]) -> str:
    header = "# spoolrl run config: resolved and frozen at 'spoolrl init'. Do not edit; resume checks it.\n"
    body = yaml.safe_dump({"config": to_dict(config), "provenance": prov}, sort_keys=False)
    return header + body


def create_run(run_dir: str | Path, config: RunConfig, *, if_missing: bool = False,
               prepare: Callable[[RunPaths, RunConfig], None] | None = None) -> RunPaths:
    """Create the run directory layout and write run.yaml. With ``if_missing``, an existing run is checked
    instead (:func:`check_resume`) and, when only resumable keys differ, its run.yaml takes the new values.

    ``prepare`` runs after the layout exists and before run.yaml is written (e.g. building the tiny
    model into RUN/model, so that its hash lands in the provenance).
    """
    paths = RunPaths(Path(run_dir))
    if paths.run_yaml.exists():
        if not if_missing:
            raise RunDirError(f"{paths.root} already holds a run; use 'spoolrl resume {paths.root}' or another path")
        _, existing = open_run(paths.root)
        if check_resume(existing, config):  # only resumable keys differ: what was rendered is what runs
            atomic_write_text(paths.run_yaml, render_run_yaml(config, read_provenance(paths.root)))
        return paths
    if paths.root.exists() and any(p for p in paths.root.iterdir() if p.name not in (".", "slurm", "logs")):
        raise RunDirError(f"{paths.root} exists, is not empty and holds no run.yaml; choose an empty or new path")
    try:
        for d in [paths.root, *paths.directories()]:
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(d, 0o700)  # whatever the umask: co-users must not replace the secret, endpoints or shards
        if not paths.secret.exists():
            fd = os.open(paths.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
        atomic_write_text(paths.layout_file, f"{LAYOUT_VERSION}\n")
        if prepare is not None:
            prepare(paths, config)
        atomic_write_text(paths.run_yaml, render_run_yaml(config, provenance(config, paths)))
    except OSError as exc:
        raise RunDirError(f"cannot create the run directory {paths.root}: {exc.strerror}; check permissions and "
                          "free space on that filesystem") from exc
    return paths


def require_run(run_dir: str | Path) -> RunPaths:
    """The run directory's paths; RunDirError (exit 2, the one wording every verb uses) without a run.yaml."""
    paths = RunPaths(Path(run_dir))
    if not paths.run_yaml.is_file():
        raise RunDirError(f"{paths.root} is not a spoolrl run directory (no run.yaml); create one with "
                          f"'spoolrl init {paths.root} --config run.yaml'")
    return paths


def open_run(run_dir: str | Path) -> tuple[RunPaths, RunConfig]:
    """Open an existing run: check its layout version and load its frozen config."""
    paths = require_run(run_dir)
    try:
        version = int(paths.layout_file.read_text().strip())
    except (OSError, ValueError) as exc:
        raise RunDirError(f"{paths.layout_file}: missing or unreadable layout version") from exc
    if version != LAYOUT_VERSION:
        raise RunDirError(f"{paths.root} has run-dir layout version {version}; this spoolrl reads version "
                          f"{LAYOUT_VERSION}. Use the spoolrl version that created it.")
    data = yaml.safe_load(paths.run_yaml.read_text()) or {}
    return paths, config_from_dict(data.get("config", {}))


def read_provenance(run_dir: str | Path) -> dict[str, Any]:
    data = yaml.safe_load(RunPaths(Path(run_dir)).run_yaml.read_text()) or {}
    return dict(data.get("provenance", {}))


def resumable_keys() -> set[str]:
    return {key for key, f, _ in iter_fields(RunConfig) if f.metadata.get("resumable")}


def config_differences(old: RunConfig, new: RunConfig) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs."""
    def flat(d: Any, prefix: str = "") -> dict[str, Any]:
        if isinstance(d, dict):
            out: dict[str, Any] = {}
            for k, v in d.items():
                out.update(flat(v, f"{prefix}.{k}" if prefix else k))
            return out
        return {prefix: d}
    a, b = flat(to_dict(old)), flat(to_dict(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def check_resume(old: RunConfig, new: RunConfig) -> list[str]:
    """Refuse changes to keys not documented as safe; return the (safe) keys that changed."""
    safe = resumable_keys()
    diffs = config_differences(old, new)
    unsafe = [(k, a, b) for k, a, b in diffs if k not in safe]
    if unsafe:
        lines = "; ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in unsafe)
        raise RunDirError(f"the config differs from the run's frozen run.yaml in keys that are not safe to change "
                          f"on resume: {lines}. Start a new run for that, or drop these overrides.")
    return [k for k, _, _ in diffs]
