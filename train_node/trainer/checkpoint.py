"""Checkpoints: DeepSpeed state + what the trainer consumed, flipped into place atomically.

Layout (``RUN/checkpoints/``)::

    step_000010-g3/   (step, then the fencing generation of the trainer that wrote it)
      meta.json       step, policy version, parent tag, covered shard ids, fencing generation,
                      world size, ZeRO stage, trainer state (feeder, trained task ids, partial shards),
                      ``files``: size and XXH3 digest of every other file of the checkpoint
      ledger.jsonl    one line per trajectory resolved since the parent: trained (step) or dropped (reason)
      rng_rank<r>.pt  python / numpy / torch (/ cuda) RNG states of each rank
      ds/             DeepSpeed ``save_checkpoint`` output (tag ``state``); removed by retention
      universal/      ``ds_to_universal`` output, made on demand when the world size changed
    LATEST            {"tag", "step", "generation"} of the newest complete checkpoint (JSON; a bare
                      tag, as older versions wrote it, is read too)

Guarantees:
- A checkpoint directory is built under a dot-prefixed temporary name; every rank fsyncs every
  file of it and the ranks digest it (each a disjoint part); after a barrier rank 0 writes the
  manifest into ``meta.json``, renames the directory into place and rewrites ``LATEST`` atomically.
  Only then may the caller commit the covered shards to the spool. A crash at any instant leaves
  LATEST naming a complete checkpoint (or none).
- Fencing: with a ``fence`` (the spool's generation check) nothing is written by a stale trainer:
  the check runs on rank 0 and is broadcast before the write, and runs again right before the
  rename, before the LATEST flip and before each retention pass (FencedError on every rank).
  The generation is part of the tag, so two trainers never write the same directory.
- :func:`verify` checks a checkpoint against its manifest (sizes, digests) before it is loaded;
  the trainer falls back along the parent chain past a torn one (see ``loop.Trainer.setup``).
- :class:`CheckpointMeta` is the one reader and writer of ``meta.json``: the trainer saves and
  resumes through it and never takes the JSON apart itself; keys older checkpoints lack read as
  their defaults (no manifest, generation 0, the current world size, version unknown).
- The lineage is the chain of ``parent`` tags from LATEST. Retention deletes only the bulky
  ``ds/`` state of old lineage members, never of the newest two (the previous one is the
  fall-back): metadata and ledgers stay, so the accounting of the whole run remains readable
  (``spoolrl checkpoints RUN``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np
import torch
import torch.distributed as tdist
import xxhash

from hpc.errors import FencedError, RecordError
from hpc.fsutil import TMP_PREFIX, atomic_write_json, fsync_dir, read_json, tmp_name
from hpc.paths import RunPaths
from hpc.records import CheckpointPointer, read_checkpoint_latest, write_checkpoint_latest
from train_node.trainer.faults import fault_point

_TAG = re.compile(r"^step_(\d{6,})(-g\d+)?(-\d+)?$")
DS_TAG = "state"
KEEP_MIN = 2  # retention never deletes the state of the newest two: the previous one is the fall-back
Fence = Callable[[], object]  # raises FencedError when a newer trainer generation exists


class EngineState(Protocol):
    """What a checkpoint saves and restores of the training engine
    (:class:`train_node.trainer.engine.Engine`: DeepSpeed's model, optimizer and scheduler state)."""

    def save(self, save_dir: Path, client_state: dict[str, Any]) -> None: ...

    def load(self, load_dir: Path, tag: str) -> object: ...


@dataclass(frozen=True)
class TrainerState:
    """What the trainer consumed, as its parts write it (``Consumer``/``Feeder`` ``to_json``)."""

    consumer: dict[str, Any]
    feeder: dict[str, Any] = field(default_factory=dict)
    nonfinite_steps: int = 0

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrainerState:
        return cls(consumer=dict(data["consumer"]), feeder=dict(data.get("feeder") or {}),
                   nonfinite_steps=int(data.get("nonfinite_steps", 0)))


@dataclass(frozen=True)
class CheckpointMeta:
    """One checkpoint's ``meta.json`` (the format on disk is unchanged); ``tag`` is its directory's
    name, not stored. ``files`` is the manifest, filled in by :func:`save`."""

    step: int
    parent: str | None
    shards: list[str]
    trainer_state: TrainerState
    policy_version: int | None = None  # None: written before versions were recorded
    fence_generation: int = 0
    world_size: int | None = None  # None: written before it was recorded (taken as this world size)
    zero_stage: int = 0
    precision: str | None = None
    t: float | None = None
    files: dict[str, list[Any]] = field(default_factory=dict)
    tag: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "policy_version": self.policy_version, "parent": self.parent,
                "shards": list(self.shards), "fence_generation": self.fence_generation,
                "world_size": self.world_size, "zero_stage": self.zero_stage, "precision": self.precision,
                "trainer_state": {"consumer": self.trainer_state.consumer, "feeder": self.trainer_state.feeder,
                                  "nonfinite_steps": self.trainer_state.nonfinite_steps},
                "t": self.t, "files": self.files}

    @classmethod
    def from_json(cls, data: dict[str, Any], tag: str) -> CheckpointMeta:
        version, world = data.get("policy_version"), data.get("world_size")
        return cls(step=int(data["step"]), parent=data.get("parent"), shards=list(data.get("shards") or []),
                   trainer_state=TrainerState.from_json(data["trainer_state"]),
                   policy_version=None if version is None else int(version),
                   fence_generation=int(data.get("fence_generation") or 0),
                   world_size=None if world is None else int(world), zero_stage=int(data.get("zero_stage") or 0),
                   precision=data.get("precision"), t=data.get("t"), files=dict(data.get("files") or {}), tag=tag)

    @classmethod
    def read(cls, paths: RunPaths, tag: str) -> CheckpointMeta:
        return cls.from_json(read_meta(paths, tag), tag)

    def needs_universal(self, world: int) -> bool:
        """Whether restoring on ``world`` ranks needs the state converted (ZeRO shards of another world size)."""
        return (self.world_size or world) != world and self.zero_stage > 0


def tag_for(step: int, generation: int = 0) -> str:
    return f"step_{step:06d}" + (f"-g{generation}" if generation else "")


def step_of(tag: str | None) -> int | None:
    m = _TAG.match(tag or "")
    return int(m.group(1)) if m else None


def new_tag(paths: RunPaths, step: int, generation: int = 0) -> str:
    """``step_NNNNNN-gG``; a second checkpoint at the same step and generation (a drain that only
    dropped samples) gets ``-k``."""
    base = tag_for(step, generation)
    k = 0
    while (paths.checkpoints / (f"{base}-{k}" if k else base)).exists():
        k += 1
    return f"{base}-{k}" if k else base


def latest_tag(paths: RunPaths) -> str | None:
    try:
        pointer = read_checkpoint_latest(paths)
    except (OSError, RecordError):
        return None
    tag = pointer.tag if pointer is not None else ""
    return tag if _TAG.match(tag) and (paths.checkpoints / tag / "meta.json").is_file() else None


def write_latest(paths: RunPaths, meta: CheckpointMeta) -> None:
    write_checkpoint_latest(paths, CheckpointPointer(meta.tag, meta.step, meta.fence_generation))


def read_meta(paths: RunPaths, tag: str) -> dict[str, Any]:
    """``meta.json`` as stored (the rows ``spoolrl checkpoints`` lists); :meth:`CheckpointMeta.read` types it."""
    return dict(read_json(paths.checkpoints / tag / "meta.json"))


def lineage(paths: RunPaths) -> list[dict[str, Any]]:
    """Metadata of every checkpoint in the lineage, oldest first, with ``tag`` and ``has_state`` added."""
    out = []
    tag = latest_tag(paths)
    while tag is not None:
        meta = read_meta(paths, tag)
        meta["tag"] = tag
        meta["has_state"] = (paths.checkpoints / tag / "ds").is_dir()
        out.append(meta)
        tag = meta.get("parent")
    return list(reversed(out))


def read_ledger(paths: RunPaths, tag: str) -> list[dict[str, Any]]:
    f = paths.checkpoints / tag / "ledger.jsonl"
    if not f.is_file():
        return []
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _broadcast_str(value: str | None) -> str:
    box = [value]
    tdist.broadcast_object_list(box, src=0)
    assert box[0] is not None
    return box[0]


def fence_collective(fence: Fence | None) -> None:
    """Collective: rank 0 runs ``fence``; a FencedError there is raised on every rank."""
    box: list[Any] = [None]
    if tdist.get_rank() == 0 and fence is not None:
        try:
            fence()
        except FencedError as exc:
            box[0] = str(exc)
    tdist.broadcast_object_list(box, src=0)
    if box[0] is not None:
        raise FencedError(box[0])


def save(engine: EngineState, paths: RunPaths, step: int, meta: CheckpointMeta | None, ledger: list[dict[str, Any]],
         *, fence: Fence | None = None) -> str:
    """Collective: every rank writes its engine shard and RNG state, fsyncs and digests; rank 0
    (the only one with ``meta``) writes the rest and flips LATEST. FencedError on every rank when a
    newer trainer exists. Returns the new tag."""
    rank = tdist.get_rank()
    if (meta is not None) != (rank == 0):
        raise ValueError(f"checkpoint.save on rank {rank}: rank 0, and only rank 0, passes the metadata")
    fence_collective(fence)
    tag = new_tag(paths, step, meta.fence_generation) if meta is not None else ""
    target = paths.checkpoints / tag
    tmp = Path(_broadcast_str(str(tmp_name(target)) if rank == 0 else None))
    if rank == 0:
        tmp.mkdir(parents=True)
    tdist.barrier()
    engine.save(tmp / "ds", client_state={"step": step})
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    tdist.barrier()  # every rank's files are written before any rank syncs or digests them
    parts: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(parts, _sync_and_digest(tmp, rank, tdist.get_world_size()))
    error: list[Any] = [None]
    if meta is not None:
        fault_point("checkpoint")
        files = {k: v for part in parts for k, v in part.items()}
        try:
            _finish(paths, tmp, target, replace(meta, files=files, tag=tag), ledger, fence)
        except FencedError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            error[0] = str(exc)
    tdist.broadcast_object_list(error, src=0)
    if error[0] is not None:
        raise FencedError(error[0])
    return tag


def _sync_and_digest(tmp: Path, rank: int, world: int) -> dict[str, list[Any]]:
    """fsync every file and directory under ``tmp`` (this rank's writes are durable wherever they
    landed); return [size, XXH3-128] of this rank's share of the files (by a hash of the name)."""
    out: dict[str, list[Any]] = {}
    for path in sorted(tmp.rglob("*")):
        rel = str(path.relative_to(tmp))
        if path.is_dir():
            fsync_dir(path)
            continue
        with open(path, "rb") as f:
            os.fsync(f.fileno())
            if zlib.crc32(rel.encode()) % world == rank:
                out[rel] = [os.fstat(f.fileno()).st_size, _digest_file(f)]
    fsync_dir(tmp)
    return out


def _digest_file(f: IO[bytes]) -> str:
    h = xxhash.xxh3_128()
    while chunk := f.read(1 << 22):
        h.update(chunk)
    return str(h.hexdigest())


def verify(paths: RunPaths, tag: str) -> str:
    """'' when the checkpoint matches its manifest (sizes and digests), else what is wrong. A
    checkpoint written before manifests existed passes when its engine state is there."""
    ck = paths.checkpoints / tag
    try:
        meta = read_meta(paths, tag)
    except (OSError, ValueError) as exc:
        return f"{tag}: meta.json unreadable: {exc}"
    if not (ck / "ds").is_dir():
        return f"{tag}: engine state ds/ is missing (deleted by retention?)"
    for rel, (size, digest) in sorted(meta.get("files", {}).items()):
        try:
            with open(ck / rel, "rb") as f:
                if os.fstat(f.fileno()).st_size != size:
                    return f"{tag}: {rel} is {os.fstat(f.fileno()).st_size} bytes, the manifest says {size}"
                if _digest_file(f) != digest:
                    return f"{tag}: {rel} does not match its digest (torn or corrupted)"
        except OSError as exc:
            return f"{tag}: {rel} unreadable: {exc}"
    return ""


def usable_latest(paths: RunPaths) -> tuple[str | None, list[dict[str, str]]]:
    """The newest checkpoint that passes :func:`verify`: LATEST, else its parent, and so on (past a
    checkpoint whose meta is unreadable: the newest other one by step). Returns the tag (None when
    none passes) and the skipped ones with what was wrong."""
    skipped: list[dict[str, str]] = []
    tag, seen = latest_tag(paths), set()
    while tag is not None and tag not in seen:
        seen.add(tag)
        problem = verify(paths, tag)
        if not problem:
            return tag, skipped
        skipped.append({"tag": tag, "problem": problem})
        try:
            tag = read_meta(paths, tag).get("parent")
        except (OSError, ValueError):
            tag = _newest_other(paths, seen)
    return None, skipped


def _newest_other(paths: RunPaths, seen: set[str]) -> str | None:
    tags = [p.name for p in paths.checkpoints.iterdir() if _TAG.match(p.name) and p.name not in seen]
    return max(tags, key=lambda t: (step_of(t) or 0, t), default=None)


def _finish(paths: RunPaths, tmp: Path, target: Path, meta: CheckpointMeta, ledger: list[dict[str, Any]],
            fence: Fence | None) -> None:
    with open(tmp / "ledger.jsonl", "w") as f:
        for entry in ledger:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    with open(tmp / "ledger.jsonl", "rb") as f:
        meta.files["ledger.jsonl"] = [os.fstat(f.fileno()).st_size, _digest_file(f)]
    atomic_write_json(tmp / "meta.json", meta.to_json())
    fsync_dir(tmp)
    if fence is not None:
        fence()
    tmp.rename(target)  # the tag holds our generation: never another trainer's directory
    fsync_dir(paths.checkpoints)
    if fence is not None:
        fence()
    write_latest(paths, meta)


def clean_temporaries(paths: RunPaths) -> None:
    if paths.checkpoints.is_dir():
        for p in [*paths.checkpoints.glob(f"{TMP_PREFIX}*@*@step_*"), *paths.checkpoints.glob(".tmp-step_*")]:
            shutil.rmtree(p, ignore_errors=True)


def retain(paths: RunPaths, keep: int, fence: Fence | None = None) -> None:
    """Delete the engine state of lineage checkpoints older than the newest ``max(keep, KEEP_MIN)``."""
    if fence is not None:
        fence()
    members = lineage(paths)
    for meta in members[:-max(keep, KEEP_MIN)]:
        for sub in ("ds", "universal"):
            shutil.rmtree(paths.checkpoints / meta["tag"] / sub, ignore_errors=True)


def universal_dir(paths: RunPaths, tag: str) -> Path:
    """Convert a ZeRO checkpoint for another world size (rank 0 only; cached next to it)."""
    ck = paths.checkpoints / tag
    out = ck / "universal"
    if (out / DS_TAG).is_dir():
        return out
    tmp = tmp_name(out)
    tmp.mkdir(parents=True)
    from deepspeed.checkpoint.ds_to_universal import main as ds_to_universal

    args = argparse.Namespace(input_folder=str(ck / "ds" / DS_TAG), output_folder=str(tmp / DS_TAG),
                              num_extract_workers=1, num_merge_workers=1, keep_temp_folder=False, strict=True,
                              inject_missing_state=False)
    try:
        ds_to_universal(args)  # one worker: in this process, no pool
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"ds_to_universal failed for {ck}: {exc}") from exc
    tmp.rename(out)
    return out


def load(engine: EngineState, paths: RunPaths, tag: str, *, universal: bool) -> None:
    """Collective: restore engine state (converted if ``universal``) and this rank's RNG state."""
    rank = tdist.get_rank()
    ck = paths.checkpoints / tag
    if universal:
        if rank == 0:
            universal_dir(paths, tag)
        tdist.barrier()
        engine.load(ck / "universal", DS_TAG)
    else:
        engine.load(ck / "ds", DS_TAG)
    rng_file = ck / f"rng_rank{rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
