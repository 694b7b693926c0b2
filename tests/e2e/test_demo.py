"""The quick start end to end on this machine: ``scripts/demo.sh`` (real engine, real bwrap sandboxes, real
DeepSpeed), run as the README's quick start runs it, by an unprivileged user (issue 38).

When the suite runs as root, every command runs as the CI user ``$SPOOLRL_CI_USER`` in the fresh HOME where
``scripts/build_image.sh`` built the sandbox image without root (the ``rootless_home`` session fixture, shared
with tests/sandbox/test_rootless_image.py): the demo finds that image, its bwrap sandboxes are unprivileged,
and the run directory is that user's. Otherwise the current user (then unprivileged anyway) runs them. The
warm-started tiny model is the one cached piece the CI user does not make itself: it is copied from this
suite's content-keyed cache into the user's, where the demo looks it up (fitting it again costs minutes).
``scripts/demo.sh`` is given the suite's venv (``SPOOLRL_VENV``): its steps run as that user (the system
packages named, not installed; the venv found set up, nothing installed; the image found built), then it
execs the venv's ``spoolrl demo``.

The demo is stopped mid-run (SIGTERM with SIGINT ignored, as ``kill`` stops a shell's background job; it must
act as Ctrl-C does and leave no process behind) and continued with ``--resume``; then the demo's printed next
step, ``spoolrl report RUN``, must agree with aggregates recomputed here from the metrics files. Whatever way
the test ends (a failed assertion, pytest-timeout), its teardown kills each command's whole session and
fails if anything survives.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpc.metrics import read_metrics
from tests.proctree import session_members
from tests.unprivileged import CI_USER, CiUser, RootlessHome

# the setup may build the rootless image (the session's first user of it) before the demo's own ~6 minutes
pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed, pytest.mark.timeout(900)]
SPOOLRL = str(Path(sys.executable).with_name("spoolrl"))  # the venv's command, as scripts/demo.sh runs it
VENV = str(Path(SPOOLRL).parents[1])
DEMO_SH = str(Path(__file__).resolve().parents[2] / "scripts" / "demo.sh")


def _last_step(run: Path) -> int:
    steps = [r["step"] for r in read_metrics(run, "train_step")]
    return max(steps, default=0)


def _naming(run: Path) -> dict[int, str]:
    """Live processes whose command line names the run directory: pid -> command line."""
    found = {}
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in argv)
        if str(run) in text:
            found[int(cmdline.parent.name)] = text[:300]
    return found


def _processes_of(run: Path, wait_s: float = 30.0) -> list[str]:
    """Command lines of live processes that name the run directory (after waiting up to ``wait_s``)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = list(_naming(run).values())
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(1)


def _printed_command(text: str, after: str) -> list[str]:
    """The arguments of the ``spoolrl`` command printed after ``after`` (shell-quoted, to paste as printed)."""
    line = next(x for x in text.splitlines() if after in x)
    argv = shlex.split(line.split(after, 1)[1])
    assert argv[0] == "spoolrl", line
    return argv[1:]


def _checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


@dataclass
class Quickstart:
    """Who runs the demo's commands and where: ``kwargs`` start them (as the CI user or as the current user),
    ``run`` is the demo's run directory (not created yet), ``owner`` the uid each of its files must have."""

    run: Path
    kwargs: dict[str, Any]
    owner: int
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def start(self, *args: str, program: str = SPOOLRL, **streams: Any) -> subprocess.Popen[str]:
        """``spoolrl ARGS`` (or ``program ARGS``) in a session of its own (so the teardown can kill all it started)."""
        proc = subprocess.Popen([program, *args], text=True, start_new_session=True, **self.kwargs, **streams)
        self.started.append(proc)
        return proc

    def run_to_end(self, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
        proc = self.start(*args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def reap(self) -> list[str]:
        """SIGKILL what is left of every started session and whatever names the run; what survived 30 s."""
        def left() -> dict[int, str]:
            pids = {pid: "" for proc in self.started for pid in session_members(proc.pid)}
            return {**pids, **_naming(self.run)}

        deadline = time.monotonic() + 30
        while (alive := left()) and time.monotonic() < deadline:
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        for proc in self.started:
            proc.wait(timeout=10)
        return [f"{pid} {cmd}" for pid, cmd in left().items()]


def seed_demo_model(user: CiUser) -> None:
    """Copy the demo's warm-started model and its tiny base from this suite's cache into the CI user's
    cache (both are keyed by content: the demo run as that user finds them there)."""
    from hpc.cli.demo_run import demo_config

    warm = Path(demo_config(6, []).model.path)  # the demo's own choice of model (fitted here on a cache miss)
    base = Path(json.loads((warm / "spoolrl_warm_start.json").read_text())["base"])
    cache = user.home / ".cache" / "spoolrl"
    for src in (warm, base):
        shutil.copytree(src, cache / src.parent.name / src.name, dirs_exist_ok=True)
    user.own(cache)


@pytest.fixture
def quickstart(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Quickstart]:
    env = {"PYTHONUNBUFFERED": "1", "SPOOLRL_VENV": VENV}
    if os.geteuid() == 0:
        home: RootlessHome = request.getfixturevalue("rootless_home")
        build = home.build
        assert build.returncode == 0, "the rootless image build failed:\n" + build.stdout[-2000:] + build.stderr[-2000:]
        assert f"by {CI_USER} (unshare mode)" in (home.image / ".spoolrl-image").read_text()  # default_image() picks it
        seed_demo_model(home.user)
        kwargs = home.user.popen_kwargs()
        kwargs["env"].update(env)
        quick = Quickstart(home.user.home / "demo run", kwargs, kwargs["user"])
    else:
        quick = Quickstart(tmp_path / "demo run", {"env": {**os.environ, **env}}, os.getuid())
    yield quick
    survivors = quick.reap()
    assert not survivors, f"processes survived SIGKILL of the demo's sessions: {survivors}"


def test_demo_interrupt_resume_and_report(quickstart: Quickstart) -> None:
    run = quickstart.run
    # the quick start's command, started with SIGINT ignored, as a shell's background job is: SIGTERM (kill,
    # timeout) must stop it as Ctrl-C does (demo.sh execs spoolrl demo, which inherits the ignored SIGINT)
    first = quickstart.start("--out", str(run), "--steps", "6", "trainer.checkpoint_every=2", program=DEMO_SH,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
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
    assert "setup_env: installing" not in out1 and "build_image: " in out1, out1  # demo.sh's steps ran, as that user
    resume = _printed_command(out1, "continue with: ")
    assert resume == ["demo", "--resume", str(run)], out1
    left = _processes_of(run)  # the roles and the inference server they started are gone, none orphaned
    assert not left, left
    interrupted_at = _last_step(run)
    assert 2 <= interrupted_at < 6, out1  # the trainer may finish steps it already has data for while draining

    second = quickstart.run_to_end(*resume, timeout=600)
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
    assert not _processes_of(run), "the finished demo left a process behind"
    strangers = [str(p) for p in [run, *run.rglob("*")] if p.lstat().st_uid != quickstart.owner]
    assert not strangers, f"not the demo user's: {strangers[:5]}"
    status = quickstart.run_to_end("status", str(run), "--once", timeout=120)
    assert status.returncode == 0 and "finished: step 6/6; started " in status.stdout, status.stdout + status.stderr
    assert "rollout rollout-" in status.stdout and ": stopped" in status.stdout and "DRAINING" not in status.stdout
    starts = [r for r in read_metrics(run, "trainer_start")]
    assert [s["step"] for s in starts][-1] >= 2, "the resumed trainer must continue from its checkpoint"

    report_argv = _printed_command(second.stderr, "; next: ")  # the printed next step, run as printed
    assert report_argv == ["report", str(run)], second.stderr[-2000:]
    report = quickstart.run_to_end(*report_argv, timeout=300)
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
