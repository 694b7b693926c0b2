"""Sandbox processes start with default signal dispositions whatever the node ignored.

A node started as ``nohup ... &`` ignores SIGINT and SIGQUIT; ``SIG_IGN`` survives exec, so
without the reset in ``spawner.default_signals`` a timed-out command ignores Ctrl-C and the
whole sandbox (and the agent's shell state) is thrown away on every timeout."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Literal

import pytest

from tests.sandbox.sbx_helpers import HERE, json_lines, need_runtime

pytestmark = pytest.mark.sandbox


def _ignore_int_quit() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def test_node_ignoring_sigint_still_interrupts_a_timed_out_command(tmp_path: Path) -> None:
    need_runtime("bwrap")
    proc = subprocess.run([sys.executable, str(HERE / "ignored_signals.py"), str(tmp_path)], capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)
    seen = json_lines(proc)[-1]
    assert seen["node_ign"] != 0, "the node process really ignored SIGINT/SIGQUIT"
    assert seen["timed_out"] and seen["exit_code"] == 130, seen["output"]
    assert "ignored Ctrl-C" not in seen["output"] and seen["same_shell"]
    assert seen["after"] == "kept\n", "the shell survived the timeout with its state"
    assert seen["shell_child_ign"] == 0 and seen["exec_ign"] == 0


def test_cli_exec_started_with_sigint_ignored_interrupts(tmp_path: Path) -> None:
    need_runtime("bwrap")
    proc = subprocess.run([sys.executable, "-m", "hpc.cli", "sandbox", "exec", "--runtime", "bwrap",
                           "--workdir", str(tmp_path), "--timeout-s", "1", "--", "sleep 100; echo after"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          preexec_fn=_ignore_int_quit, env={**os.environ})
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["timed_out"] and result["exit_code"] == 130, result
    assert "ignored Ctrl-C" not in result["output"]


USR1 = 1 << (signal.SIGUSR1 - 1)


def test_the_python_fallback_resets_ignored_signals_too() -> None:
    """Everything at its default but Slurm's time-limit warning (SIGUSR1), which stays ignored."""
    from rollout_node.sandbox.spawner import _SHIM
    proc = subprocess.run([sys.executable, "-S", "-c", _SHIM, "grep", "^SigIgn:", "/proc/self/status"],
                          capture_output=True, text=True, timeout=60, preexec_fn=_ignore_int_quit)
    assert proc.returncode == 0 and int(proc.stdout.split()[1], 16) == USR1, proc


@pytest.mark.parametrize("runtime", ["bwrap", pytest.param("apptainer", marks=pytest.mark.apptainer)])
def test_sandbox_processes_ignore_the_time_limit_warning(tmp_path: Path, runtime: Literal["bwrap", "apptainer"]) -> None:
    """Slurm sends the warning (SIGUSR1) to every process of the step, the sandboxes first: the
    shell, its commands and an exec (the EVAL) survive it; the node alone acts on it. (apptainer's
    starter resets signal dispositions: the boot script ignores it again.)"""
    need_runtime(runtime)
    from hpc.config.sandbox import SandboxConfig
    from rollout_node.sandbox import open_sandbox

    with open_sandbox(SandboxConfig(runtime=runtime), tmp_path / "w") as box:
        shell = box.run("grep ^SigIgn: /proc/$$/status; kill -USR1 $$; echo alive")
        fresh = box.exec(["sh", "-c", "grep ^SigIgn: /proc/self/status; kill -USR1 $$; echo alive"])
    for r in (shell, fresh):
        assert r.exit_code == 0 and r.output.endswith("alive\n"), r
    assert int(shell.output.split()[1], 16) & USR1, shell  # an interactive bash ignores a few more
    assert int(fresh.output.split()[1], 16) == USR1, fresh


def test_rollout_node_started_with_sigint_ignored_keeps_its_shell(tmp_path: Path) -> None:
    """``spoolrl rollout-node`` under nohup-like signals: the hang episode's command is interrupted
    by Ctrl-C (no sandbox kill), and the task is trained-ready once with reward 1."""
    need_runtime("bwrap")
    from hpc.config import load_config
    from hpc.rundir import create_run
    from hpc.spool import Spool
    from rollout_node.tasks import load_tasks
    cfg = load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
                             "spool.poll_interval_s=0.2", "spool.shard_max_age_s=1", "rollout.policy=scripted",
                             "rollout.scripted_plan=hang", "algorithm.group_size=2", "rollout.run_workers=2",
                             f"sandbox.scratch_dir={tmp_path / 'scratch'}"])
    paths = create_run(tmp_path / "run", cfg)
    task = load_tasks("builtin")[0].instance_id
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": task, "instance_id": task, "group_size": 2}])
    with open(tmp_path / "node.out", "wb") as log:
        rc = subprocess.run([sys.executable, "-m", "hpc.cli", "rollout-node", str(paths.root), "--node-id", "n1",
                             "--once"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            timeout=240, preexec_fn=_ignore_int_quit).returncode
    assert rc == 0, (tmp_path / "node.out").read_text()[-3000:]
    trajectories = [t for s in Spool(paths.root, cfg.spool).claim_shards("t", 100) for t in s.trajectories()]
    assert [(t.task_id, t.reward) for t in trajectories] == [(task, 1.0)] * 2
    text = bytes(i - 3 for i in trajectories[0].token_ids if 3 <= i < 259).decode(errors="replace")
    assert "sleep 3600" in text, "the hang command was run"
    assert "ignored Ctrl-C" not in text and "sandbox was killed" not in text, text
