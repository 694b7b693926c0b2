"""Multi-node training wiring: the real trainer over two Slurm nodes equals torchrun on one node.

Two identical run directories (the same tiny Qwen2, fp32, ZeRO-2, 3 steps, the same synthetic
trajectory groups pre-filled into each spool in the same order; the feeder's task ids match the
groups' ids, so no rollouts are needed). ``spoolrl train-node`` then runs
(a) as a 2-task Slurm step over gpu1 + gpu2 (rank, world size and rendezvous come only from
    ``SlurmEnv``: the step's environment holds no ``RANK``/``WORLD_SIZE``), and
(b) under ``torchrun --standalone --nproc_per_node=2`` on this host,
both as the unprivileged CI user, concurrently. The per-step losses must agree.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from slurm_helpers import CI_USER, SHARED, chown_to_ci

pytestmark = [pytest.mark.slurm, pytest.mark.deepspeed, pytest.mark.timeout(400)]

STEPS = 3
GROUPS_PER_STEP = 2
GROUP_SIZE = 4
JOB_NAME = "spoolrl-test-multinode"
DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
             "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def base_dir(ci_user: str) -> Iterator[Path]:
    path = SHARED / "spoolrl-tests" / f"multinode {uuid.uuid4().hex[:6]}"
    path.mkdir(parents=True)
    yield path
    subprocess.run(["scancel", f"--name={JOB_NAME}", f"--user={CI_USER}", "--quiet"], capture_output=True)
    subprocess.run(["rm", "-rf", str(path)], capture_output=True)


def _config(tasks_file: Path) -> Any:
    from hpc.config import config_from_dict

    return config_from_dict({
        "tasks": {"source": str(tasks_file), "epochs": 1},
        "trainer": {"zero_stage": 2, "precision": "fp32", "total_steps": STEPS, "micro_batch_tokens": 64,
                    "lr": 1e-3, "checkpoint_every": 1000, "publish_every": 1000, "prefetch": True},
        "algorithm": {"group_size": GROUP_SIZE, "groups_per_step": GROUPS_PER_STEP, "max_staleness": 1000,
                      "drop_zero_variance": False},
        "spool": {"poll_interval_s": 0.05, "shard_max_age_s": 0.5},
        "slurm": {"train": {"gpus_per_node": 0}},
    })


def _groups(n: int) -> list[Any]:
    from tests.trainer.helpers import make_group

    rng = np.random.default_rng(7)
    return [make_group(f"task{i:03d}@e0", [1.0, 0.0, 1.0, 0.0][:GROUP_SIZE], rng) for i in range(n)]


def _make_run(root: Path, tasks_file: Path, groups: list[Any]) -> Path:
    from hpc.rundir import create_run
    from tests.trainer.helpers import tiny_model, write_groups

    paths = create_run(root, _config(tasks_file), prepare=lambda p, _c: tiny_model(p.model, seed=0))
    write_groups(paths.root, groups)
    chown_to_ci(paths.root)
    return paths.root


def _clean_env() -> dict[str, str]:
    """This process's environment without distributed or Slurm variables (pytest may run inside a job)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in DIST_VARS}
    env.update(OMP_NUM_THREADS="1", SPOOLRL_FAULT="", PYTHONUNBUFFERED="1")
    return env


def _metrics(run: Path) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for line in (run / "metrics" / "trainer-0.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["kind"], []).append(rec)
    return out


def _losses(m: dict[str, list[dict[str, Any]]]) -> list[float]:
    return [float(r["loss"]) for r in sorted(m.get("train_step", []), key=lambda r: int(r["step"]))]


def test_two_slurm_nodes_train_like_torchrun_on_one_node(ci_python: Path, base_dir: Path) -> None:
    pytest.importorskip("deepspeed", reason="component unavailable: deepspeed is not installed in this venv")
    tasks_file = base_dir / "tasks.jsonl"
    n_groups = STEPS * GROUPS_PER_STEP
    tasks_file.write_text("".join(json.dumps({"instance_id": f"task{i:03d}"}) + "\n" for i in range(n_groups)))
    groups = _groups(n_groups)
    slurm_run = _make_run(base_dir / "run slurm", tasks_file, groups)
    local_run = _make_run(base_dir / "run torchrun", tasks_file, groups)
    chown_to_ci(base_dir)
    env = _clean_env()
    cli = ["-m", "hpc.cli", "train-node"]
    # $0/$1 carry the interpreter and the run path, so the path with a space needs no quoting
    step = ["runuser", "-u", CI_USER, "--", "srun", "-p", "gpu", "-N2", "-n2", "--ntasks-per-node=1",
            "--mem=1500M", "-t", "6", f"--job-name={JOB_NAME}", "bash", "-c",
            'echo "node=$SLURMD_NODENAME procid=$SLURM_PROCID"; exec "$0" -m hpc.cli train-node "$1" --max-idle-s 120',
            str(ci_python), str(slurm_run)]
    torchrun = ["runuser", "-u", CI_USER, "--", str(ci_python), "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node=2", *cli, str(local_run), "--max-idle-s", "120"]
    with subprocess.Popen(torchrun, cwd="/tmp", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as local:
        slurm_out = subprocess.run(step, cwd="/tmp", env=env, capture_output=True, text=True, timeout=330)
        local_log, _ = local.communicate(timeout=330)
    assert slurm_out.returncode == 0, (slurm_out.stdout + slurm_out.stderr)[-4000:]
    assert local.returncode == 0, local_log[-4000:]
    nodes = sorted(line.split()[0] for line in slurm_out.stdout.splitlines() if line.startswith("node="))
    assert nodes == ["node=gpu1", "node=gpu2"], slurm_out.stdout[-2000:]

    on_slurm, on_torchrun = _metrics(slurm_run), _metrics(local_run)
    for m in (on_slurm, on_torchrun):
        assert [r["world_size"] for r in m["trainer_start"]] == [2]
        assert [r["reason"] for r in m["trainer_stop"]] == ["total_steps"]
        assert [r["groups"] for r in m["train_step"]] == [GROUPS_PER_STEP] * STEPS
    got, want = _losses(on_slurm), _losses(on_torchrun)
    print(f"losses slurm={got} torchrun={want} exact={got == want}")
    assert len(got) == len(want) == STEPS
    assert all(np.isfinite(got)) and got != [got[0]] * STEPS  # real, changing losses, not a constant
    assert got == pytest.approx(want, rel=0, abs=1e-6), (got, want)
