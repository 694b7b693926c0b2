"""What the report reads besides metrics: the checkpoints' ledgers (which trajectory was trained at which step,
or dropped and why), tokens by fate, and the sample rollouts of recent steps.

Guarantees:
- Read-only, files only (``RUN/checkpoints/*/ledger.jsonl``, ``RUN/spool/shards``, ``run.yaml``); no role
  package is imported. A missing or unreadable piece gives an empty answer, never an exception.
- Tokens by fate: ``trained`` is the trainer's ``loss_tokens``; ``dropped`` splits the generated tokens of
  dropped trajectories by reason (a ledger row joined with its episode record by trajectory id);
  ``context`` counts the tokens with ``loss_mask`` 0 (prompts, observations, template pieces), which
  are never trained; ``not_trained_other`` is what generated tokens remain (infrastructure failures,
  in flight, not yet checkpointed).
- Samples: among the trajectories trained in the last ``steps`` steps (by the ledgers; without ledgers,
  the latest shards) the best and the worst by reward, ties broken by trajectory id.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpc.decode import run_shards
from hpc.paths import RunPaths
from hpc.trajectory import Trajectory


def read_ledgers(paths: RunPaths) -> list[dict[str, Any]]:
    """Every ledger row of every checkpoint directory (a row resolved twice, after a fall-back, counts once)."""
    rows: dict[str, dict[str, Any]] = {}
    for f in sorted(paths.checkpoints.glob("*/ledger.jsonl")):
        if f.parent.name.startswith("."):
            continue
        try:
            lines = f.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("trajectory_id"):
                rows[str(row["trajectory_id"])] = row
    return list(rows.values())


def episode_key(rec: dict[str, Any]) -> str:
    """The trajectory id an episode record stands for (the rollout node's ``TASK:sN:aK`` naming)."""
    return f"{rec.get('task_id')}:s{rec.get('sample_index')}:a{rec.get('attempt')}"


def tokens_by_fate(records: list[dict[str, Any]], ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """Trained, dropped by reason, context (mask 0) and other not-trained tokens (see the module docstring)."""
    records_ = [r for r in records if r.get("kind") == "episode"]
    episodes = {episode_key(r): r for r in records_}
    generated = sum(int(r.get("generated_tokens") or 0) for r in records_)
    context = sum(max(int(r.get("tokens") or 0) - int(r.get("generated_tokens") or 0), 0) for r in records_)
    trained = sum(int(r.get("loss_tokens") or 0) for r in records if r.get("kind") == "train_step")
    dropped: Counter[str] = Counter()
    for row in ledger:
        if row.get("outcome") == "dropped":
            ep = episodes.get(str(row["trajectory_id"]), {})
            dropped[str(row.get("reason") or "unknown")] += int(ep.get("generated_tokens") or 0)
    return {"generated": generated, "trained": trained, "dropped": dict(dropped), "context": context,
            "not_trained_other": max(generated - trained - sum(dropped.values()), 0)}


def _trajectories(shards: Iterable[Path]) -> Iterable[Trajectory]:
    from hpc.errors import SpoolrlError
    from hpc.shard import read_shard_file, table_trajectories

    for path in shards:
        try:
            yield from table_trajectories(read_shard_file(path), str(path))
        except SpoolrlError:
            continue


def recent_samples(paths: RunPaths, ledger: list[dict[str, Any]], *, steps: int = 2, latest_shards: int = 4
                   ) -> tuple[list[tuple[str, Trajectory]], str]:
    """[("best", traj), ("worst", traj)] of recent steps, and a sentence saying where they came from."""
    trained = [r for r in ledger if r.get("outcome") == "trained" and isinstance(r.get("step"), int)]
    shards = run_shards(paths.root)
    if trained:
        last = sorted({int(r["step"]) for r in trained})[-steps:]
        wanted = {str(r["trajectory_id"]): int(r["step"]) for r in trained if r["step"] in last}
        names = {f"{r['shard_id']}.shard" for r in trained if r["step"] in last}
        pool = [t for t in _trajectories(p for p in shards if p.name in names) if t.trajectory_id in wanted]
        where = f"trajectories trained at step{'s' if len(last) > 1 else ''} {', '.join(map(str, last))}"
    else:
        pool = list(_trajectories(shards[-latest_shards:]))
        where = f"the run's {min(len(shards), latest_shards)} latest shards (no checkpoint ledger yet)"
    scored = sorted((t for t in pool if t.reward is not None), key=lambda t: (-float(t.reward or 0), t.trajectory_id))
    if not scored:
        return [], where
    picks = [("best", scored[0])]
    if len(scored) > 1:
        picks.append(("worst", scored[-1]))
    return picks, where


def run_model(paths: RunPaths) -> str:
    """``model.path`` from run.yaml ('' when unreadable)."""
    import yaml

    try:
        data: Any = yaml.safe_load(paths.run_yaml.read_text())
    except (OSError, yaml.YAMLError):
        return ""
    return str((((data or {}).get("config") or {}).get("model") or {}).get("path") or "")
