"""Resume scenarios in one process (run by test_resume.py): each trainer "rank" is a forked child.

Imports torch/transformers/DeepSpeed once; every trainer run forks ``nproc`` children that set
their rank, world size and rendezvous exactly as torchrun would, so a restart costs an engine init
instead of a Python start. A child killed by a fault point takes its peers down (the driver
SIGKILLs the rest, as Slurm ends a step whose task died).

Usage: resume_driver.py BASE NPROC STAGE. Prints ``RESULT {json}``: per-step losses of an
uninterrupted reference run and of a run killed right after its step-2 checkpoint and resumed,
plus (NPROC 2) a resume of that lineage by one process through a universal checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: imports are by package path

from tests.trainer.helpers import free_port, make_run, run_config, standard_groups, write_groups  # noqa: E402


def _rank_main(run: Path, rank: int, nproc: int, port: int, overrides: list[str], fault: str) -> None:
    os.environ["SPOOLRL_FAULT"] = fault
    from hpc.config import apply_overrides, config_from_dict, to_dict
    from hpc.rundir import open_run
    from train_node.trainer.dist_env import DistEnv
    from train_node.trainer.loop import Options, Trainer

    _, cfg = open_run(run)
    cfg = config_from_dict(apply_overrides(to_dict(cfg), overrides))
    t = Trainer(run, cfg, Options(max_idle_s=20), dist=DistEnv(rank, rank, nproc, "127.0.0.1", port, "launcher"))
    t.setup()
    os._exit(t.run())


def train(run: Path, nproc: int, *overrides: str, fault: str = "") -> list[int]:
    """Fork the ranks; returns their exit statuses (negative = killed by that signal)."""
    port = free_port()
    pids = []
    for rank in range(nproc):
        pid = os.fork()
        if pid == 0:
            try:
                _rank_main(run, rank, nproc, port, list(overrides), fault)
            finally:
                os._exit(3)
        pids.append(pid)
    statuses: dict[int, int] = {}
    while len(statuses) < nproc:
        pid, status = os.wait()
        statuses[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        if statuses[pid] != 0:  # one rank died: end the others, as the launcher would
            for other in pids:
                if other not in statuses:
                    try:
                        os.kill(other, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
    return [statuses[p] for p in pids]


def losses(run: Path) -> dict[int, float]:
    from hpc.metrics import read_metrics

    return {r["step"]: r["loss"] for r in read_metrics(run, "train_step")}


def prepare(root: Path, stage: int) -> Path:
    cfg = run_config(trainer={"zero_stage": stage, "checkpoint_every": 2, "total_steps": 2, "lr": 3e-3,
                              "micro_batch_tokens": 64})
    paths = make_run(root, cfg)
    write_groups(paths.root, standard_groups(12, seed=7))
    return paths.root


def main() -> None:
    base, nproc, stage = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    import deepspeed  # noqa: F401
    import torch  # noqa: F401

    import train_node.trainer.loop  # noqa: F401
    from hpc.metrics import read_metrics
    from train_node.trainer import checkpoint as ckpt

    out: dict[str, Any] = {}
    ref, run = prepare(base / "ref", stage), prepare(base / "run", stage)
    t0 = time.monotonic()
    out["ref_status"] = train(ref, nproc, f"trainer.total_steps={4 if nproc == 2 else 3}")
    out["crash_status"] = train(run, nproc, "trainer.total_steps=3", fault="after_checkpoint:1")
    out["latest_after_crash"] = ckpt.latest_tag(ckpt.RunPaths(run))
    out["resume_status"] = train(run, nproc, "trainer.total_steps=3")
    out["ref_losses"], out["run_losses"] = losses(ref), losses(run)
    paths = ckpt.RunPaths(run)
    ledger = [e for m in ckpt.lineage(paths) for e in ckpt.read_ledger(paths, m["tag"])]
    out["ledger"] = len(ledger)
    out["ledger_unique"] = len({e["trajectory_id"] for e in ledger})
    if nproc == 2:
        out["universal_status"] = train(run, 1, "trainer.total_steps=4")
        out["universal_start"] = list(read_metrics(run, "trainer_start"))[-1]
        out["universal_dir"] = any((run / "checkpoints").glob("step_000003-g*/universal"))
        out["run_losses"] = losses(run)
    out["seconds"] = round(time.monotonic() - t0, 1)
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
