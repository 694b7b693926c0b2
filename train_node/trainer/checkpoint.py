"""Checkpoints: DeepSpeed state + what the trainer consumed, flipped into place atomically.

Layout (``RUN/checkpoints/``)::

    step_000010/
      meta.json       step, policy version, parent tag, covered shard ids, fencing generation,
                      world size, ZeRO stage, trainer state (feeder, trained task ids, partial shards)
      ledger.jsonl    one line per trajectory resolved since the parent: trained (step) or dropped (reason)
      rng_rank<r>.pt  python / numpy / torch (/ cuda) RNG states of each rank
      ds/             DeepSpeed ``save_checkpoint`` output (tag ``state``); removed by retention
      universal/      ``ds_to_universal`` output, made on demand when the world size changed
    LATEST            the tag of the newest complete checkpoint (text)

Guarantees:
- A checkpoint directory is built under a dot-prefixed temporary name and renamed into place
  when complete; ``LATEST`` is rewritten atomically afterwards. Only then may the caller commit
  the covered shards to the spool. A crash at any instant leaves LATEST naming a complete
  checkpoint (or none).
- The lineage is the chain of ``parent`` tags from LATEST. Retention deletes only the bulky
  ``ds/`` state of old lineage members: metadata and ledgers stay, so the accounting of the whole
  run remains readable (``spoolrl checkpoints RUN``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist

from hpc.fsutil import atomic_write_json, atomic_write_text, fsync_dir, read_json, tmp_name
from hpc.paths import RunPaths
from train_node.trainer.faults import fault_point

_TAG = re.compile(r"^step_(\d{6,})(-\d+)?$")
DS_TAG = "state"


def tag_for(step: int) -> str:
    return f"step_{step:06d}"


def step_of(tag: str | None) -> int | None:
    m = _TAG.match(tag or "")
    return int(m.group(1)) if m else None


def new_tag(paths: RunPaths, step: int) -> str:
    """``step_NNNNNN``; a second checkpoint at the same step (a drain that only dropped samples) gets ``-k``."""
    latest = latest_tag(paths)
    if step_of(latest) != step:
        return tag_for(step)
    assert latest is not None
    k = int(latest.rpartition("-")[2]) + 1 if "-" in latest else 1
    return f"{tag_for(step)}-{k}"


def latest_tag(paths: RunPaths) -> str | None:
    try:
        tag = paths.checkpoint_latest.read_text().strip()
    except OSError:
        return None
    return tag if _TAG.match(tag) and (paths.checkpoints / tag / "meta.json").is_file() else None


def read_meta(paths: RunPaths, tag: str) -> dict[str, Any]:
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


def save(engine: Any, paths: RunPaths, step: int, meta: dict[str, Any], ledger: list[dict[str, Any]]) -> str:
    """Collective: every rank writes its engine shard and RNG state; rank 0 writes the rest and flips LATEST."""
    rank = tdist.get_rank()
    tag = new_tag(paths, step) if rank == 0 else ""
    target = paths.checkpoints / tag
    tmp = Path(_broadcast_str(str(tmp_name(target)) if rank == 0 else None))
    if rank == 0:
        tmp.mkdir(parents=True)
    tdist.barrier()
    engine.save(tmp / "ds", client_state={"step": step})
    torch.save(rng_state(), tmp / f"rng_rank{rank}.pt")
    tdist.barrier()
    if rank == 0:
        fault_point("checkpoint")
        _finish(paths, tmp, target, tag, meta, ledger)
    tdist.barrier()
    return tag


def _finish(paths: RunPaths, tmp: Path, target: Path, tag: str, meta: dict[str, Any],
            ledger: list[dict[str, Any]]) -> None:
    with open(tmp / "ledger.jsonl", "w") as f:
        for entry in ledger:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    atomic_write_json(tmp / "meta.json", meta)
    fsync_dir(tmp)
    if target.exists():  # from a crashed attempt that renamed but never flipped LATEST: not in the lineage
        shutil.rmtree(target)
    tmp.rename(target)
    fsync_dir(paths.checkpoints)
    atomic_write_text(paths.checkpoint_latest, tag + "\n")


def clean_temporaries(paths: RunPaths) -> None:
    if paths.checkpoints.is_dir():
        for p in paths.checkpoints.glob(".tmp-step_*"):
            shutil.rmtree(p, ignore_errors=True)


def retain(paths: RunPaths, keep: int) -> None:
    """Delete the engine state of lineage checkpoints older than the newest ``keep``."""
    members = lineage(paths)
    for meta in members[:-keep] if keep else members:
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


def load(engine: Any, paths: RunPaths, tag: str, *, universal: bool) -> None:
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
