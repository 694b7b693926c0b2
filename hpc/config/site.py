"""The config's paths as this host sees them: the check that reads the filesystem (the rest of
validation is pure).

A run names files the job will read after the queue wait: the model and tokenizer, the task file,
the repository cache, the sandbox image, each group's container or (without one) its interpreter
when given as a path, and vLLM's interpreter. :func:`site_problems` looks at them
from here. A path that exists only on the cluster (a laptop validating a cluster config) is named
explicitly: with ``paths_on_cluster`` the existence checks are skipped and :func:`unchecked_paths`
lists what was not looked at, so the caller says so instead of passing silently.

Guarantees:
- Every problem names the dotted key, the path and the fix; all are returned together.
- ``model.path`` (unless ``tiny``) must be a directory holding ``config.json`` whose chat template
  is supported (:func:`hpc.chat_format.check_model_dir`); ``model.tokenizer_path``, when set, a
  directory with a supported template.
- Only existence and kind are read (``is_dir``/``is_file``) plus the chat template; nothing is created.
"""

from __future__ import annotations

import typing as tp
from pathlib import Path

from hpc.config.tasks import builtin_task_file
from hpc.errors import ConfigError
from hpc.paths import TINY_MODEL

if tp.TYPE_CHECKING:
    from hpc.config import RunConfig

Kind = tp.Literal["dir", "file", "any"]


def named_paths(config: RunConfig) -> list[tuple[str, str, Kind]]:
    """(dotted key, path, kind) of every path the run's job reads; empty and built-in values are not paths."""
    out: list[tuple[str, str, Kind]] = []
    if config.model.path != TINY_MODEL:
        out.append(("model.path", config.model.path, "dir"))
    if config.model.tokenizer_path:
        out.append(("model.tokenizer_path", config.model.tokenizer_path, "dir"))
    if builtin_task_file(config.tasks.source) is None:
        out.append(("tasks.source", config.tasks.source, "file"))
    if config.tasks.repo_cache:
        out.append(("tasks.repo_cache", config.tasks.repo_cache, "dir"))
    if config.sandbox.image:
        out.append(("sandbox.image", config.sandbox.image, "any"))
    for role in ("train", "infer", "rollout"):
        group = getattr(config.slurm, role)
        if group.container and group.nodes:
            out.append((f"slurm.{role}.container", group.container, "any"))
        elif "/" in group.python and group.nodes:  # a path (a bare name is looked up on the node's PATH)
            out.append((f"slurm.{role}.python", group.python, "file"))
    if config.inference.engine == "vllm" and "/" in config.inference.vllm_python and not config.slurm.infer.container:
        out.append(("inference.vllm_python", config.inference.vllm_python, "file"))
    return out


def _missing(key: str, path: str, kind: Kind) -> str | None:
    p = Path(path)
    if kind == "dir" and not p.is_dir():
        what = "is not a directory" if p.exists() else "does not exist here"
    elif kind == "file" and not p.is_file():
        what = "is not a file" if p.exists() else "does not exist here"
    elif kind == "any" and not p.exists():
        what = "does not exist here"
    else:
        return None
    return (f"{key}: {path} {what}; fix the path, or, if it exists only on the cluster, say so with "
            "--paths-on-cluster (then nothing checks it before the job starts)")


def _model_problems(config: RunConfig, key: str, path: str) -> list[str]:
    """The chat template of the directory the tokenizer comes from; config.json in the model's."""
    from hpc.chat_format import check_model_dir

    if key == "model.tokenizer_path" or not config.model.tokenizer_path:
        try:
            check_model_dir(Path(path), key)
        except ConfigError as exc:
            return list(exc.problems)
    if key == "model.path" and not (Path(path) / "config.json").is_file():
        return [f"{key}: {path} holds no config.json, so it is not a Hugging Face model directory (one with "
                "config.json, safetensors and tokenizer.json; 'spoolrl model from-gguf' converts a GGUF file)"]
    return []


def site_problems(config: RunConfig, *, paths_on_cluster: bool = False) -> list[str]:
    """Problems with the paths the config names, as seen from here (none checked with ``paths_on_cluster``)."""
    if paths_on_cluster:
        return []
    problems = []
    for key, path, kind in named_paths(config):
        if (why := _missing(key, path, kind)) is not None:
            problems.append(why)
        elif key in ("model.path", "model.tokenizer_path"):
            problems += _model_problems(config, key, path)
    return problems


def unchecked_paths(config: RunConfig) -> str:
    """One line naming the paths ``paths_on_cluster`` leaves unchecked ('' when there are none)."""
    named = [f"{key}={path}" for key, path, _ in named_paths(config)]
    return f"not checked here (--paths-on-cluster): {', '.join(named)}" if named else ""


def check_site(config: RunConfig) -> None:
    """For a process that runs here (rollout-server): raise ConfigError listing every path problem."""
    if problems := site_problems(config):
        raise ConfigError(problems)
