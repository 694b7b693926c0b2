"""``spoolrl status`` and ``spoolrl report`` say what happened (issue 38 items 3, 8, 9; issue 34 item 5), through
the command line, on a run directory whose metrics files are written here with the writers the roles use.

The run: 4 of 4 steps, two tasks per step with 4 finished episodes each; one episode per step is not in the
trained batch (a per-sample drop), so the episode reward and the trained batch's differ and both are checked
against values computed here. The rollout node's last record says it was draining; it withdrew its presence.
Every finished episode is a harness episode (``segments_per_episode`` on its record, as the node writes it); one of
them was split into 2 segments with 30 tokens prefilled again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hpc.cli import main
from hpc.metrics import MetricsWriter
from hpc.paths import LAYOUT_VERSION, RunPaths

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
# per step: episode rewards of task a and of task b; the last one of b is not trained (dropped per sample)
EPISODES = {s: ([1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]) if s <= 2 else ([1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0])
            for s in range(1, STEPS + 1)}


def _batch_reward(step: int) -> float:
    a, b = EPISODES[step]
    kept = a + b[:-1]
    return sum(kept) / len(kept)


def _episode_reward(step: int) -> float:
    a, b = EPISODES[step]
    return sum(a + b) / len(a + b)


@pytest.fixture
def run(tmp_path: Path) -> Path:
    root = tmp_path / "run"
    paths = RunPaths(root)
    paths.metrics.mkdir(parents=True)
    paths.run_yaml.write_text(yaml.safe_dump({"config": {"run": {"name": "t"}, "trainer": {"total_steps": STEPS}}}))
    paths.layout_file.write_text(f"{LAYOUT_VERSION}\n")
    (paths.logs / "train").mkdir(parents=True)
    (paths.logs / "train" / "123_0_log.err").write_text("trainer says hi\n")
    (paths.logs / "rollout-n1.log").write_text("rollout says hi\n")
    node = MetricsWriter(root, "rollout-n1")
    trainer = MetricsWriter(root, "trainer-0")
    trainer.log("trainer_start", step=0)
    for step in range(1, STEPS + 1):
        for task, rewards in zip("ab", EPISODES[step], strict=True):
            for i, reward in enumerate(rewards):
                split = (step, task, i) == (1, "b", 2)
                node.log("episode", task_id=f"{task}{step}", sample_index=i, attempt=0, status="ok", reward=reward,
                         generated_tokens=10, timings={"run_s": 1.0}, segments_per_episode=2 if split else 1,
                         reprefill_tokens=30 if split else 0)
        node.log("episode", task_id=f"a{step}", sample_index=9, attempt=0, status="sandbox_error", reward=None)
        trainer.log("train_step", step=step, loss=0.5, loss_tokens=40, reward_mean=_batch_reward(step),
                    pass_rate=0.5, task_ids=[f"a{step}", f"b{step}"], lr=1e-4 * step, step_kl=0.01 * step,
                    kl=0.002, grad_norm=1.5 / step, staleness_hist={"0": 7}, drops={"too_long": step},
                    idle_fraction=0.1, tokens_per_s=100.0, nonfinite_steps=1)
    node.log("node", worker_id="n1-0", episodes=36, episodes_per_min=3.0, queue_depth={"init": 0, "run": 2, "eval": 1},
             busy={"init": 0, "run": 1, "eval": 0}, failures={}, draining="stop")
    trainer.log("trainer_stop", step=STEPS, reason="total_steps", exit_code=0)
    return root


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_status_says_what_happened(run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "status", str(run), "--once")
    assert code == 0, err
    first = sum(_episode_reward(s) for s in (1, 2, 3)) / 3
    last = sum(_episode_reward(s) for s in range(1, STEPS + 1)) / STEPS
    batch_first = sum(_batch_reward(s) for s in (1, 2, 3)) / 3
    assert f"finished: step {STEPS}/{STEPS}; started " in out and "last record" in out, out
    assert (f"reward {first:.2f} (mean of the first 3 steps) -> {last:.2f} (last {STEPS} steps), over every finished "
            f"episode of the step's tasks; trained batch reward (after filters) {batch_first:.2f}") in out, out
    assert abs(first - batch_first) > 0.01  # the two figures really differ here
    assert "non-finite steps (skipped, nothing applied): 1" in out
    assert ("harness episodes 32: 1.03 segments per episode (max 2; 1 split into several), tokens prefilled again 30 "
            "(0.9 per episode)") in out, out
    assert "rollout rollout-n1: stopped (stop)" in out and "DRAINING" not in out  # presence withdrawn
    assert "queued init 0, run 2, eval 1" in out
    assert "no Slurm job recorded for this run" in out
    assert f"logs (train): {run}/logs/train/123_0_log.err" in out and f"{run}/logs/rollout-n1.log" in out
    assert "{" not in out and "}" not in out, out  # no Python dict reprs
    code, out, _ = _cli(capsys, "status", str(run), "--json")
    summary = json.loads(out)["summary"]
    assert summary["finished"] is True and summary["step"] == STEPS and summary["nonfinite_steps"] == 1
    assert summary["duration_s"] >= 0 and summary["reward_first"] == round(first, 3)
    assert summary["harness"] == {"episodes": 32, "segments_per_episode_mean": 1.031, "segments_per_episode_max": 2,
                                  "split_episodes": 1, "reprefill_tokens": 30, "reprefill_tokens_per_episode": 0.9}


@pytest.mark.parametrize("value", ["0", "-1", "0.1"])
def test_status_refuses_a_busy_interval(run: Path, capsys: pytest.CaptureFixture[str], value: str) -> None:
    code, _, err = _cli(capsys, "status", str(run), "--interval-s", value)
    assert code == 2
    assert f"--interval-s {float(value):g}: the live view re-reads the whole run directory" in err
    assert "at least 0.5 seconds" in err


def test_report_has_summary_config_and_training_plots(run: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _cli(capsys, "report", str(run))
    assert code == 0 and err == "", err
    report = json.loads((run / "report" / "report.json").read_text())
    reward = report["series"]["reward"]
    assert reward["reward (every finished episode of the step's tasks)"]["y"] == [
        _episode_reward(s) for s in range(1, STEPS + 1)]
    assert reward["trained batch reward (after filters)"]["y"] == [_batch_reward(s) for s in range(1, STEPS + 1)]
    assert report["series"]["lr"]["learning rate"]["y"] == [1e-4 * s for s in range(1, STEPS + 1)]
    assert report["series"]["grad_norm"]["gradient norm (before clipping)"]["y"] == [1.5 / s for s in range(1, 5)]
    assert "step KL (measured after the update)" in report["series"]["step_kl"]
    assert {"lr", "step_kl", "grad_norm", "queue_depth", "reward"} <= set(report["plots"])
    assert report["summary"]["finished"] and report["config"] == (run / "run.yaml").read_text()
    page = (run / "report" / "report.html").read_text()
    assert "<th>Wall time</th>" in page and "total_steps: 4" in page and "<b>finished</b>: step" in page
    assert "Non-finite steps" in page and "over every finished episode of the step&#x27;s tasks" in page
    assert report["summary"]["harness"]["reprefill_tokens"] == 30
    assert "<th>Harness segments</th>" in page and "1 split into several), tokens prefilled again 30" in page

    missing = tmp_path / "no such dir" / "r.html"
    code, _, err = _cli(capsys, "report", str(run), "-o", str(missing))
    assert code == 2 and f"the directory {missing.parent} does not exist" in err and "Traceback" not in err


def test_report_without_matplotlib_writes_page_and_json(run: Path) -> None:
    # sys.modules[name] = None makes 'import matplotlib' raise ModuleNotFoundError, as in a venv without it
    code = ("import sys; sys.modules['matplotlib'] = None; from hpc.cli import main; "
            f"sys.exit(main(['report', {str(run)!r}]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["spoolrl report: matplotlib is not installed: wrote the HTML page and "
                                       "report.json without plots (for plots: pip install 'spoolrl[report]')"]
    assert out.stdout.strip() == str(run / "report" / "report.html")
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["plots"] == {} and "matplotlib is not installed" in report["skipped"]["reward"]
    assert not list((run / "report").glob("*.png"))
    assert "<th>Reward</th>" in (run / "report" / "report.html").read_text()
