"""A stale trainer cannot damage the lineage (issue 14, item 3).

Two ``spoolrl train-node`` processes on one run directory: A trains, is stopped (SIGSTOP: a hung
node) with a step trained and published but not checkpointed; B starts, fences, resumes from A's
checkpoint and trains on; A is continued and asked to drain, so it tries its final checkpoint. A
must exit with a FencedError having written nothing: LATEST, the lineage and the policy stay B's,
and every trajectory is in the lineage's ledgers exactly once. Also: the publisher and retention
refuse a stale generation, directly.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hpc.errors import FencedError
from hpc.metrics import read_metrics
from hpc.paths import RunPaths
from hpc.spool import Spool
from train_node.trainer import checkpoint as ckpt
from train_node.trainer.publish import Publisher

from .helpers import free_port, make_run, run_config, standard_groups, write_groups


def _wait(what: Callable[[], bool], procs: list[subprocess.Popen[str]], timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert all(p.poll() is None for p in procs), [p.poll() for p in procs]
        assert time.monotonic() < deadline
        time.sleep(0.2)


def _start(root: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()), SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", "train-node", str(root)], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _policy(paths: RunPaths) -> str:
    try:
        return paths.policy_latest.read_text().strip()
    except OSError:
        return ""


@pytest.mark.deepspeed
@pytest.mark.timeout(600)
def test_two_train_nodes_on_one_run_dir(tmp_path: Path) -> None:
    cfg = run_config(trainer={"checkpoint_every": 2, "total_steps": 100})
    paths = make_run(tmp_path / "run", cfg)
    groups = standard_groups(6)  # three steps of two groups
    write_groups(paths.root, groups)
    a = _start(paths.root)
    b: subprocess.Popen[str] | None = None
    try:
        _wait(lambda: _policy(paths) == "3", [a])  # A: checkpoint at step 2, step 3 trained and published
        a.send_signal(signal.SIGSTOP)
        b = _start(paths.root)
        # B fences, resumes at A's step 2, republishes those weights (v4) and trains step 3 again (v5)
        _wait(lambda: _policy(paths) == "5", [b])
        paths.stop_marker.write_text("drain\n")
        a.send_signal(signal.SIGCONT)
        _, a_err = a.communicate(timeout=120)
        _, b_err = b.communicate(timeout=120)
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.communicate()
    assert a.returncode not in (0, 75) and "generation 2 exists" in a_err, a_err[-3000:]
    assert b.returncode == 0, b_err[-3000:]
    tags = [m["tag"] for m in ckpt.lineage(paths)]
    assert tags == ["step_000002-g1", "step_000003-g2"], tags
    assert not [p.name for p in paths.checkpoints.iterdir() if p.name.startswith("step_000003-g1")]
    assert _policy(paths) == "5" and os.readlink(paths.policy_version(5)) == "v000005-g2"
    assert not list(paths.policy.glob("v00000[4-9]-g1"))  # A published nothing after B fenced
    ledger = [e for t in tags for e in ckpt.read_ledger(paths, t)]
    produced = sorted(t.trajectory_id for g in groups for t in g)
    assert sorted(e["trajectory_id"] for e in ledger) == produced  # each exactly once
    steps_of: dict[str, set[int]] = {}
    for e in ledger:
        if e["outcome"] == "trained":
            steps_of.setdefault(e["task_id"], set()).add(e["step"])
    assert len(steps_of) == 6 and all(len(s) == 1 for s in steps_of.values())
    stats = Spool(paths.root).stats()
    assert stats["shards_committed"] == 6 and stats["shards_ready"] == stats["shards_claimed"] == 0
    assert [r["generation"] for r in read_metrics(paths.root, "trainer_start")] == [1, 2]


def test_stale_publisher_and_retention_are_refused(tmp_path: Path) -> None:
    from transformers import Qwen2Config

    paths = RunPaths(tmp_path)
    old, new = Spool(tmp_path), Spool(tmp_path)
    gen1 = old.fence("trainer")
    sd = {"model.embed_tokens.weight": torch.zeros(4, 2)}
    cfg = Qwen2Config(vocab_size=4, hidden_size=2, num_hidden_layers=1, num_attention_heads=1,
                      num_key_value_heads=1, intermediate_size=2, tie_word_embeddings=True)
    stale = Publisher(paths, cfg, None, keep=1, background=False, generation=gen1,
                      fence=lambda: old.check_fence("trainer"))
    assert stale.publish(sd).version == 0
    assert os.readlink(paths.policy_version(0)) == "v000000-g1" and _policy(paths) == "0"
    gen2 = new.fence("trainer")
    current = Publisher(paths, cfg, None, keep=1, background=False, generation=gen2,
                        fence=lambda: new.check_fence("trainer"))
    with pytest.raises(FencedError):
        stale.publish(sd)  # refused before anything is written
    assert _policy(paths) == "0" and not list(paths.policy.glob("v000001*"))
    with pytest.raises(FencedError):
        stale._retain(5)
    assert paths.policy_version(0).is_dir()
    assert current.publish(sd).version == 1 and os.readlink(paths.policy_version(1)) == "v000001-g2"
    assert _policy(paths) == "1"
    paths.checkpoints.mkdir()
    with pytest.raises(FencedError):
        ckpt.retain(paths, 1, fence=lambda: old.check_fence("trainer"))
