"""The non-finite guard across ranks: :func:`guard_sequence`, run by grad_worker.py on the engine of its
2-rank ZeRO-0 run (test_grad_exact.py, one torchrun start for both checks).

Three updates: rank 1 alone sees a NaN advantage (a NaN loss), then rank 1 alone gets an infinite gradient
from a hook (a finite loss, an infinite gradient), then the clean batch again. What each rank saw is what
test_grad_exact.py asserts.
"""

from __future__ import annotations

from typing import Any

import torch

from train_node.trainer.engine import Engine, StepResult
from train_node.trainer.packing import MicroBatch


def _state(engine: Engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def _record(engine: Engine, start: dict[str, torch.Tensor], result: StepResult | None = None) -> dict[str, Any]:
    now = _state(engine)
    return {**({"nonfinite": result.nonfinite, "updates": result.updates} if result is not None else {}),
            "unchanged": all(torch.equal(now[k], start[k]) for k in start),
            "finite": all(bool(torch.isfinite(v).all()) for v in now.values()),
            "adam_steps": sorted({float(s["step"]) for s in engine.optimizer.state.values() if "step" in s}),
            "last_epoch": engine.scheduler.last_epoch, "lr": engine.optimizer.param_groups[0]["lr"],
            "checksum": float(sum(v.double().sum() for v in now.values()))}


def guard_sequence(engine: Engine, batch: Any) -> list[dict[str, Any]]:
    """``batch()`` gives this rank's micro-batches (fresh arrays each call). Returns the state before, then after
    each of the three updates."""
    start = _state(engine)
    log = [_record(engine, start)]
    mine: list[MicroBatch] = batch()
    if engine.rank == 1:
        mine[0].advantages[:] = float("nan")  # a corrupt row that only this rank trains
    log.append(_record(engine, start, engine.train_step(mine)))
    hook = next(engine.module.parameters()).register_hook(lambda g: g * float("inf")) if engine.rank == 1 else None
    log.append(_record(engine, start, engine.train_step(batch())))
    if hook is not None:
        hook.remove()
    log.append(_record(engine, start, engine.train_step(batch())))
    return log
