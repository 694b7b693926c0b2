"""Where a trainer process sits: torchrun variables, else SlurmEnv (srun task), else a single process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from train_node.trainer.dist_env import RENDEZVOUS_VARS, resolve

ROOT = Path(__file__).resolve().parents[2]


def test_launcher_variables_win() -> None:
    d = resolve({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "1234",
                 "SLURM_JOB_ID": "7", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"})
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.master_port, d.source) == (3, 8, 1, "n1", 1234,
                                                                                            "launcher")


def test_srun_task_of_the_train_group() -> None:
    env = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_LOCALID": "1",
           "SLURM_NTASKS": "8", "SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_RESTART_COUNT": "2"}
    d = resolve(env)
    assert (d.rank, d.world_size, d.local_rank, d.master_addr, d.source) == (5, 8, 1, "gpu07", "slurm")
    requeued = resolve({**env, "SLURM_RESTART_COUNT": "3"})
    assert requeued.master_port != d.master_port  # a requeued job never reuses its predecessor's port


def test_single_process_without_launcher() -> None:
    d = resolve({})
    assert (d.rank, d.world_size, d.source) == (0, 1, "single")
    assert resolve({"MASTER_PORT": "31337"}).master_port == 31337
    import socket

    with socket.socket() as busy:  # a port another single trainer holds (the old fixed 29500) is not chosen
        busy.bind(("127.0.0.1", d.master_port))
        busy.listen()
        assert resolve({}).master_port != d.master_port


# in a child: the process group is global state; the port the trainer picked is taken before the rendezvous
_TAKEN_PORT = """
import os, socket
from dataclasses import replace
import torch.distributed as tdist
from train_node.trainer.dist_env import resolve
from train_node.trainer.engine import init_distributed
env = resolve({})
taken = socket.socket()
taken.bind(("127.0.0.1", env.master_port))
taken.listen()
given = replace(env, port_picked=False)  # a port given by the user or a launcher is used as given
try:
    init_distributed(given)
except tdist.DistNetworkError as exc:
    print("given port refused:", "EADDRINUSE" in str(exc))
init_distributed(env)
print("picked another:", tdist.is_initialized())  # the picked port is still taken: another one served
"""


def _child(script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh Python (the process group is global state) with no launcher variables."""
    env = {k: v for k, v in os.environ.items() if k not in (*RENDEZVOUS_VARS, "LOCAL_RANK")}
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)}, stdin=subprocess.DEVNULL)


def test_a_picked_port_taken_before_the_rendezvous_is_replaced() -> None:
    done = _child(_TAKEN_PORT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["given port refused: True", "picked another: True"], done.stdout


_ENV_AFTER_INIT = """
import json, os
import torch.distributed as tdist
from train_node.trainer.dist_env import RENDEZVOUS_VARS, resolve
from train_node.trainer.engine import init_distributed
assert not any(k in os.environ for k in RENDEZVOUS_VARS)
init_distributed(resolve({}))
print(json.dumps({"initialized": tdist.is_initialized(), "local_rank": os.environ.get("LOCAL_RANK"),
                  "rendezvous": {k: os.environ.get(k) for k in RENDEZVOUS_VARS}}))
"""


def test_the_rendezvous_variables_do_not_outlive_the_init() -> None:
    """An in-process trainer's rendezvous stays out of ``os.environ`` once the group is up: a process it (or
    a later test) starts must not take RANK/WORLD_SIZE/MASTER_* for a launcher's. DeepSpeed's LOCAL_RANK
    stays (alone it makes no launcher's environment)."""
    done = _child(_ENV_AFTER_INIT)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["initialized"] is True and seen["local_rank"] == "0"
    assert seen["rendezvous"] == dict.fromkeys(RENDEZVOUS_VARS), seen["rendezvous"]  # unset, as before the init
