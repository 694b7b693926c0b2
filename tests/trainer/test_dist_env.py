"""Where a trainer process sits: torchrun variables, else SlurmEnv (srun task), else a single process."""

from __future__ import annotations

from train_node.trainer.dist_env import resolve


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
print("picked another:", tdist.is_initialized() and int(os.environ["MASTER_PORT"]) != env.master_port)
"""


def test_a_picked_port_taken_before_the_rendezvous_is_replaced() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _TAKEN_PORT], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(root)}, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-2:] == ["given port refused: True", "picked another: True"], done.stdout
