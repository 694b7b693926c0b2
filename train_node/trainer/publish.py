"""Publishing policy weights for the inference servers: ``RUN/policy/vNNNNNN/`` + ``RUN/policy/LATEST``.

Layout: the weights of version N written by the trainer of fencing generation G live in
``vNNNNNN-gG/``; ``vNNNNNN`` (what servers open) is a relative symlink to it. Policies of runs
before generations were named are plain ``vNNNNNN/`` directories and stay readable.

Guarantees:
- A version directory appears complete or not at all: files go into a dot-prefixed temporary
  sibling, are fsynced, and the directory is renamed into place; then the ``vNNNNNN`` link is
  made. ``LATEST`` (the single source of truth for the current version) is written atomically,
  after the link.
- Fencing: with a ``fence`` (the spool's generation check) a stale trainer publishes nothing: it
  is checked before the write, before the link, before LATEST and before retention (FencedError).
  Two trainers never write the same directory (the generation is in its name); the link is taken
  without replacing (``symlink`` fails on an existing name), and only a trainer that passes the
  fence check replaces a link an older generation made.
- Versions only grow: a new publisher starts at (highest version directory or LATEST) + 1, so a
  crash between rename and LATEST wastes a number instead of reusing it.
- Weights only: HF ``model.safetensors`` (tied weights stored once), ``config.json``, and the
  tokenizer files copied from the model's tokenizer directory. Loads with ``from_pretrained``.
- Writing happens on a background thread; ``publish`` returns once the weights are copied to CPU.
  At most one write is in flight: a second ``publish`` waits for the first (reported as
  ``wait_s``), so memory stays bounded at one CPU copy of the weights.
- Retention keeps the newest ``keep`` versions; the one LATEST names is never removed, nor one an
  inference server serves or is loading (its endpoint files say so: :mod:`train_node.infer.pins`).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from hpc.errors import RecordError
from hpc.fsutil import TMP_PREFIX, fsync_dir, tmp_name
from hpc.paths import RunPaths
from hpc.records import read_policy_latest, write_policy_latest
from train_node.infer.pins import versions_in_use
from train_node.trainer.faults import fault_point

if TYPE_CHECKING:
    from transformers import PretrainedConfig

_VERSION_DIR = re.compile(r"^v(\d{6,})$")
_GEN_DIR = re.compile(r"^v(\d{6,})-g(\d+)$")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json", "generation_config.json")


def published_versions(paths: RunPaths) -> list[int]:
    if not paths.policy.is_dir():
        return []
    names = [p.name for p in paths.policy.iterdir()]
    return sorted({int(m.group(1)) for n in names if (m := _VERSION_DIR.match(n) or _GEN_DIR.match(n))})


def latest_version(paths: RunPaths) -> int | None:
    try:
        return read_policy_latest(paths)
    except (OSError, RecordError):
        return None


def next_version(paths: RunPaths) -> int:
    candidates = published_versions(paths) + [latest_version(paths) or -1]
    return max(candidates, default=-1) + 1


def clean_temporaries(paths: RunPaths) -> None:
    """Remove half-written version directories a crashed publisher left behind."""
    if paths.policy.is_dir():
        for p in [*paths.policy.glob(f"{TMP_PREFIX}*@*@v[0-9]*"), *paths.policy.glob(".tmp-v*")]:  # and older runs' names
            shutil.rmtree(p, ignore_errors=True)


def link_version(paths: RunPaths, version: int, target: Path, fence: Callable[[], object] | None) -> None:
    """Point ``vNNNNNN`` at ``target`` (a sibling): taken without replacing; an existing link is
    replaced only after the fence check passes (it was made by an older generation)."""
    link = paths.policy_version(version)
    if fence is not None:
        fence()
    try:
        os.symlink(target.name, link)
    except FileExistsError:
        tmp = tmp_name(link)
        os.symlink(target.name, tmp)
        os.replace(tmp, link)  # atomic: a reader sees the old link or the new one
    fsync_dir(paths.policy)


def remove_version(paths: RunPaths, version: int) -> None:
    """Delete version ``version``: the link and the directory it names, or a plain directory."""
    link = paths.policy_version(version)
    if link.is_symlink():
        target = paths.policy / os.readlink(link)
        link.unlink(missing_ok=True)
        shutil.rmtree(target, ignore_errors=True)
    else:
        shutil.rmtree(link, ignore_errors=True)
    for p in paths.policy.glob(f"{link.name}-g*"):  # written but never linked (a fenced trainer)
        shutil.rmtree(p, ignore_errors=True)


def write_policy_dir(target: Path, state_dict: dict[str, torch.Tensor], config: PretrainedConfig, tokenizer_dir: Path | None) -> None:
    """Write one complete version directory at ``target`` (temporary dir + rename)."""
    from safetensors.torch import save_file

    tmp = tmp_name(target)
    tmp.mkdir(parents=True)
    tensors = _untie(state_dict, config)
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    fault_point("publish")
    config.save_pretrained(str(tmp))
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                shutil.copy2(tokenizer_dir / name, tmp / name)
    for f in tmp.iterdir():
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    fsync_dir(tmp)
    tmp.rename(target)
    fsync_dir(target.parent)


def _untie(state_dict: dict[str, torch.Tensor], config: PretrainedConfig) -> dict[str, torch.Tensor]:
    """safetensors refuses shared storage; HF re-ties ``lm_head`` from the embedding on load."""
    out = {k: v.contiguous() for k, v in state_dict.items()}
    if getattr(config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


@dataclass
class PublishStats:
    version: int
    copy_s: float
    wait_s: float
    write_s: float = 0.0


@dataclass
class Publisher:
    """Rank-0 object; ``publish`` after a step, ``close`` at the end (waits for the last write)."""

    paths: RunPaths
    config: PretrainedConfig  # the HF model config
    tokenizer_dir: Path | None
    keep: int = 3
    background: bool = True
    generation: int = 0  # the trainer's fencing generation: part of every directory name
    fence: Callable[[], object] | None = None  # raises FencedError when a newer trainer exists
    version: int = field(init=False)
    _thread: threading.Thread | None = field(init=False, default=None)
    _error: BaseException | None = field(init=False, default=None)
    last: PublishStats | None = field(init=False, default=None)
    completed: PublishStats | None = field(init=False, default=None)  # the newest finished write

    def __post_init__(self) -> None:
        self.paths.policy.mkdir(parents=True, exist_ok=True)
        clean_temporaries(self.paths)
        self.version = next_version(self.paths) - 1  # the last number used; publish() takes the next

    def publish(self, state_dict: dict[str, torch.Tensor], copy_s: float = 0.0) -> PublishStats:
        t0 = time.perf_counter()
        self.wait()
        if self.fence is not None:
            self.fence()
        self.version += 1
        stats = PublishStats(version=self.version, copy_s=copy_s, wait_s=time.perf_counter() - t0)
        if self.background:
            self._thread = threading.Thread(target=self._run, args=(self.version, state_dict, stats),
                                            name=f"publish-v{self.version}", daemon=True)
            self._thread.start()
        else:
            self._run(self.version, state_dict, stats)
            self._raise()
        self.last = stats
        return stats

    def _run(self, version: int, state_dict: dict[str, torch.Tensor], stats: PublishStats) -> None:
        t0 = time.perf_counter()
        try:
            name = self.paths.policy_version(version).name + (f"-g{self.generation}" if self.generation else "")
            target = self.paths.policy / name
            if target.exists():  # a leftover of this generation (never linked)
                shutil.rmtree(target)
            write_policy_dir(target, state_dict, self.config, self.tokenizer_dir)
            if self.generation:
                link_version(self.paths, version, target, self.fence)
            if self.fence is not None:
                self.fence()
            write_policy_latest(self.paths, version)
            self._retain(version)
        except BaseException as exc:  # surfaced on the main thread by wait()
            self._error = exc
        stats.write_s = time.perf_counter() - t0
        self.completed = stats

    def _retain(self, current: int) -> None:
        if self.fence is not None:
            self.fence()
        in_use = versions_in_use(self.paths.endpoints)  # served or being loaded by an inference server
        for v in published_versions(self.paths):
            if v <= current - self.keep and v not in in_use:
                remove_version(self.paths, v)

    def wait(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err

    def close(self) -> None:
        self.wait()
