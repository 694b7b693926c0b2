"""``spoolrl demo`` end to end on this machine: real engine, real bwrap sandboxes, real DeepSpeed.

It is stopped mid-run (SIGTERM with SIGINT ignored, as ``kill`` stops a shell's background job; it must
act as Ctrl-C does and leave no process behind) and continued with ``--resume``; then
``spoolrl report`` must agree with aggregates recomputed here from the metrics files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpc.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]
SPOOLRL = [sys.executable, "-m", "hpc.cli"]


def _last_step(run: Path) -> int:
    steps = [r["step"] for r in read_metrics(run, "train_step")]
    return max(steps, default=0)


def _processes_of(run: Path, wait_s: float = 30.0) -> list[str]:
    """Command lines of live processes that name the run directory (after waiting up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
            try:
                argv = cmdline.read_bytes().split(b"\0")
            except OSError:
                continue
            text = " ".join(a.decode(errors="replace") for a in argv)
            if str(run) in text:
                found.append(text[:300])
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


def test_demo_interrupt_resume_and_report(tmp_path: Path) -> None:
    run = tmp_path / "demo run"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # started with SIGINT ignored, as a shell's background job is: SIGTERM (kill, timeout) must stop it as Ctrl-C does
    first = subprocess.Popen([*SPOOLRL, "demo", "--out", str(run), "--steps", "6", "trainer.checkpoint_every=2"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline and first.poll() is None:
        if run.exists() and _checkpoints(run):
            break
        time.sleep(1)
    assert first.poll() is None, f"demo ended before its first checkpoint:\n{first.stdout.read() if first.stdout else ''}"
    first.send_signal(signal.SIGTERM)
    out1, _ = first.communicate(timeout=120)
    assert first.returncode == 130, out1
    assert "spoolrl demo --resume" in out1
    left = _processes_of(run)  # the roles and the inference server they started are gone, none orphaned
    assert not left, left
    interrupted_at = _last_step(run)
    assert 2 <= interrupted_at < 6, out1  # the trainer may finish steps it already has data for while draining

    second = subprocess.run([*SPOOLRL, "demo", "--resume", str(run)], capture_output=True, text=True, env=env,
                            timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    lines = [json.loads(x) for x in second.stdout.splitlines() if x.startswith("{")]
    assert any(x["demo"] == "progress" for x in lines), "no JSON progress lines when not on a terminal"
    summary = lines[-1]
    assert summary["demo"] == "summary" and summary["step"] == 6 and summary["role_errors"] == {}
    assert json.loads((run / "summary.json").read_text()) == summary
    # per-role logs where the README says: each role's output in RUN/logs/<role>/, the trainer's included
    for role in ("train", "infer", "rollout"):
        assert any(f.stat().st_size > 0 for f in (run / "logs" / role).glob("*_log.*")), role
    assert not (run / "slurm" / "demo").exists(), "no stray RUN/slurm/demo/%j directory"
    status = subprocess.run([*SPOOLRL, "status", str(run), "--once"], capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "finished: step 6/6; started " in status.stdout, status.stdout + status.stderr
    assert "rollout rollout-" in status.stdout and ": stopped" in status.stdout and "DRAINING" not in status.stdout
    starts = [r for r in read_metrics(run, "trainer_start")]
    assert [s["step"] for s in starts][-1] >= 2, "the resumed trainer must continue from its checkpoint"

    report = subprocess.run([*SPOOLRL, "report", str(run)], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    data = json.loads((run / "report" / "report.json").read_text())
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    reward = data["series"]["reward"]["trained batch reward (after filters)"]
    assert sorted(zip(reward["x"], reward["y"], strict=True)) == sorted((float(r["step"]), float(r["reward_mean"])) for r in steps)
    assert max(reward["x"]) == 6.0
    # the reward the demo, status and the report print: every finished episode of the step's tasks
    by_task: dict[str, list[float]] = {}
    for e in read_metrics(run, "episode"):
        if isinstance(e.get("reward"), (int, float)):
            by_task.setdefault(e["task_id"], []).append(float(e["reward"]))
    expected = []
    for step in sorted({r["step"]: r for r in steps}.items()):
        values = [v for t in step[1]["task_ids"] for v in by_task.get(t, [])]
        expected.append(sum(values) / len(values))
    episodes = data["series"]["reward"]["reward (every finished episode of the step's tasks)"]
    assert [y for _, y in sorted(zip(episodes["x"], episodes["y"], strict=True))] == pytest.approx(expected)
    trained = sum(int(r.get("loss_tokens") or 0) for r in read_metrics(run, "train_step"))
    assert data["accounting"]["tokens_trained"] == trained > 0
    episodes = list(read_metrics(run, "episode"))
    assert data["accounting"]["episodes"] == len(episodes) > 0
    import matplotlib.image as mpimg

    assert data["plots"], "no plots"
    for name, png in data["plots"].items():
        assert np.asarray(mpimg.imread(png)).std() > 0.01, f"{name} is blank"
