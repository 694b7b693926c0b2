"""The non-finite guard across ranks (run by test_nonfinite.py under torchrun with 2 ranks, ZeRO-0, gloo).

Usage: nonfinite_worker.py MODEL_DIR OUT_PREFIX. Three updates: rank 1 alone sees a NaN advantage (a NaN
loss), then rank 1 alone gets an infinite gradient from a hook (a finite loss, an infinite gradient norm),
then a clean batch. Each rank writes what it saw to OUT_PREFIX.RANK.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1])]

from hpc.config import AlgorithmConfig  # noqa: E402
from train_node.trainer.dist_env import resolve  # noqa: E402
from train_node.trainer.engine import Engine, StepResult, init_distributed, load_model  # noqa: E402
from train_node.trainer.packing import plan_step  # noqa: E402
from trainer.grad_worker import samples  # noqa: E402
from trainer.helpers import run_config  # noqa: E402


def _state(engine: Engine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def _record(engine: Engine, result: StepResult, start: dict[str, torch.Tensor]) -> dict[str, Any]:
    now = _state(engine)
    return {"nonfinite": result.nonfinite, "updates": result.updates,
            "unchanged": all(torch.equal(now[k], start[k]) for k in start),
            "finite": all(bool(torch.isfinite(v).all()) for v in now.values()),
            "adam_steps": [float(s["step"]) for s in engine.optimizer.state.values() if "step" in s],
            "last_epoch": engine.scheduler.last_epoch, "lr": engine.optimizer.param_groups[0]["lr"],
            "checksum": float(sum(v.double().sum() for v in now.values()))}


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    init_distributed(resolve())
    cfg = run_config(trainer={"zero_stage": 0, "lr": 1e-2, "warmup_steps": 4})
    engine = Engine(load_model(model_dir, "fp32", False), cfg.trainer, AlgorithmConfig())
    plan = plan_step(samples(), engine.world, 96)
    mine = plan.per_rank[engine.rank]
    log = []
    start = _state(engine)
    if engine.rank == 1:
        mine[0].advantages[:] = float("nan")  # a corrupt row that only this rank trains
    log.append(_record(engine, engine.train_step(mine), start))
    mine = plan_step(samples(), engine.world, 96).per_rank[engine.rank]
    hook = None
    if engine.rank == 1:
        hook = next(engine.module.parameters()).register_hook(lambda g: g * float("inf"))
    log.append(_record(engine, engine.train_step(mine), start))
    if hook is not None:
        hook.remove()
    log.append(_record(engine, engine.train_step(mine), start))
    Path(f"{out}.{engine.rank}.json").write_text(json.dumps(log))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
