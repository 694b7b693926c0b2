"""Gradient of one train step (run by test_grad_exact.py: alone, or under torchrun with 2 ranks).

Usage: grad_worker.py MODEL_DIR OUT.pt MICRO_BATCH_TOKENS [GUARD_OUT]. Builds the step's samples from a fixed
seed, plans them for this world size, runs ``Engine.train_step`` and captures the gradients the
optimizer receives (after DeepSpeed's data-parallel reduction) by wrapping its ``step``. With GUARD_OUT,
the same engine then runs :func:`nonfinite_worker.guard_sequence` and each rank writes GUARD_OUT.RANK.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: imports are by package path

from hpc.config import AlgorithmConfig  # noqa: E402
from tests.trainer.helpers import run_config  # noqa: E402
from tests.trainer.nonfinite_worker import guard_sequence  # noqa: E402
from train_node.trainer.dist_env import resolve  # noqa: E402
from train_node.trainer.engine import Engine, init_distributed, load_model  # noqa: E402
from train_node.trainer.packing import Sample, plan_step  # noqa: E402


def samples() -> list[Sample]:
    rng = np.random.default_rng(11)
    out = []
    for i in range(12):
        n = int(rng.integers(8, 40))
        mask = np.zeros(n, dtype=np.int8)
        mask[n // 3:] = 1
        lp = np.where(mask == 1, -rng.uniform(3, 7, n), 0).astype(np.float32)
        out.append(Sample(f"t{i}", rng.integers(3, 300, n).astype(np.int32), mask, lp, float(rng.normal()),
                          float(rng.choice([0.7, 1.0]))))
    return out


def main() -> None:
    model_dir, out, mbt = sys.argv[1], sys.argv[2], int(sys.argv[3])
    torch.set_num_threads(1)
    init_distributed(resolve())
    cfg = run_config(trainer={"zero_stage": 0, "grad_clip": 0.0, "lr": 1e-3})
    engine = Engine(load_model(model_dir, "fp32", False), cfg.trainer, AlgorithmConfig(clip_low=0.1, clip_high=0.1))
    captured: dict[str, torch.Tensor] = {}
    opt = engine.ds.optimizer
    original = opt.step

    def capture(*args, **kwargs):  # type: ignore[no-untyped-def]
        for name, p in engine.module.named_parameters():
            assert p.grad is not None
            captured[name] = p.grad.detach().clone()
        return original(*args, **kwargs)

    opt.step = capture
    plan = plan_step(samples(), engine.world, mbt)
    result = engine.train_step(plan.per_rank[engine.rank])
    if engine.rank == 0:
        torch.save({"grads": captured, "loss": result.sums.loss, "tokens": result.sums.tokens,
                    "micro_batches": [len(m) for m in plan.per_rank]}, out)
    opt.step = original
    if len(sys.argv) > 4:
        log = guard_sequence(engine, lambda: plan_step(samples(), engine.world, mbt).per_rank[engine.rank])
        Path(f"{sys.argv[4]}.{engine.rank}.json").write_text(json.dumps(log))
    # Tear gloo down before the interpreter does, then leave without running C++ destructors: a non-zero
    # gloo rank can abort in its teardown at exit ("terminate called without an active exception", status
    # 134; seen in CI twice, the second time after the barrier and destroy), as tests/slurm/ddp_probe.py
    # found and fixed the same way.
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
