"""``spoolrl status``: progress parts over the metrics files and the live (refreshing) view."""

from __future__ import annotations

import io
from pathlib import Path

from hpc.metrics import MetricsWriter
from hpc.paths import RunPaths
from hpc.status import format_status, run_status, watch


def _run(root: Path) -> RunPaths:
    paths = RunPaths(root)
    for d in paths.directories():
        d.mkdir(parents=True)
    (paths.root / "run.yaml").write_text("config: {}\nprovenance: {}\n")
    MetricsWriter(root, "trainer-0").log("train_step", step=7, loss=0.5, reward_mean=0.25, pass_rate=0.25,
                                          idle_fraction=0.1, tokens_per_s=900.0, staleness_hist={"1": 4},
                                          drops={"too_stale": 2}, loss_tokens=10)
    node = MetricsWriter(root, "rollout-a")
    node.log("episode", status="sandbox_error", generated_tokens=30, timings={"run_s": 3.0})
    node.log("node", queue_depth={"init": 1, "run": 2, "eval": 3}, busy={"run": 4}, episodes=9,
             episodes_per_min=3.5, failures={"sandbox_crash": 1}, draining="")
    return paths


def test_status_json_has_progress_parts(tmp_path: Path) -> None:
    status = run_status(_run(tmp_path / "run").root)
    assert status["training"]["step"] == 7 and status["training"]["drops"] == {"too_stale": 2}
    assert status["pipeline"]["rollout-a"]["queue_depth"] == {"init": 1, "run": 2, "eval": 3}
    assert status["accounting"]["tokens_generated"] == 30 and status["accounting"]["tokens_trained"] == 10
    assert status["errors"] == {} or "jobs" in status["errors"]
    text = format_status(status)
    assert "step 7/?" in text and "last step 7:" in text and "episodes 9 (3.5/min)" in text and "sandbox_crash" in text


def test_live_view_redraws(tmp_path: Path) -> None:
    paths = _run(tmp_path / "run")
    out = io.StringIO()
    watch(paths.root, out, interval_s=0.5, max_updates=2)  # 0.5 s: the floor (no busy loop)
    assert out.getvalue().count("\x1b[H\x1b[2J") == 2
    assert "refreshing every" in out.getvalue()


def test_trainer_part_reads_both_latest_formats(tmp_path: Path) -> None:
    from hpc.paths import RunPaths
    from hpc.status import trainer_part

    paths = RunPaths(tmp_path)
    paths.checkpoint_latest.parent.mkdir(parents=True)
    paths.checkpoint_latest.write_text('{"generation": 2, "step": 7, "tag": "step_000007-g2"}\n')
    assert trainer_part(paths) == {"policy_version": None, "checkpoint": "step_000007-g2", "step": 7}
    paths.checkpoint_latest.write_text("step_000005-g1\n")  # a bare tag (older runs)
    assert trainer_part(paths)["step"] == 5 and trainer_part(paths)["checkpoint"] == "step_000005-g1"
