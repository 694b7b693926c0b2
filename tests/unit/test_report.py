"""The report: series and accounting recomputed from metrics files; sacct parsing; no blank plots; the HTML page's
summary, tokens by fate and sample rollouts (best and worst of the last steps, decoded, trained text marked)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hpc.accounting import parse_sacct, parse_tres
from hpc.metrics import MetricsWriter
from hpc.paths import RunPaths
from hpc.report import write_report
from hpc.spool import Spool
from tests.unit import chat_fixture as cf


def _fake_run(root: Path) -> RunPaths:
    paths = RunPaths(root)
    paths.metrics.mkdir(parents=True)
    trainer = MetricsWriter(root, "trainer-0")
    for step in range(1, 4):
        trainer.log("train_step", step=step, loss=1.0 / step, loss_tokens=100 * step, reward_mean=0.1 * step,
                    pass_rate=0.05 * step, idle_fraction=0.5 / step, staleness_hist={"0": 3, "1": step},
                    drops={"zero_variance": step})
    node = MetricsWriter(root, "rollout-n1")
    for i in range(3):
        node.log("episode", status="ok" if i else "sandbox_error", generated_tokens=400, timings={"run_s": 36.0})
        node.log("node", episodes_per_min=2.0 + i, queue_depth={"init": i, "run": 1, "eval": 0},
                 stage_s={"run": {"p50": 1.0 + i, "p95": 2.0 + i}})
    return paths


def test_report_matches_metrics_and_plots_are_not_blank(tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    paths = _fake_run(tmp_path / "run")
    html = write_report(paths.root)
    report = json.loads((paths.root / "report" / "report.json").read_text())
    assert report["series"]["reward"]["trained batch reward (after filters)"]["y"] == [0.1, 0.2, 0.30000000000000004]
    assert report["series"]["staleness"]["max staleness"]["y"] == [1.0, 1.0, 1.0]
    assert report["series"]["failures_by_kind"] == {"sandbox_error": 1}
    acct = report["accounting"]
    assert acct["tokens_generated"] == 1200 and acct["tokens_trained"] == 600
    assert acct["tokens_discarded"] == 600 and acct["waste_percent"] == 50.0
    assert acct["samples_discarded_by_reason"] == {"zero_variance": 3}
    assert abs(acct["sandbox_hours"] - 108.0 / 3600) < 1e-12
    for name, png in report["plots"].items():
        img = mpimg.imread(png)
        assert np.asarray(img).std() > 0.01, f"{name} plot is blank"
    assert "data:image/png;base64," in html.read_text()


def test_sacct_parsing_per_role() -> None:
    assert parse_tres("billing=2,cpu=2,gres/gpu=1,mem=8G,node=1")["gpu"] == 1.0
    text = "12+0|3600|cpu=4,gres/gpu=2,node=1\n12+1|1800|cpu=2,gres/gpu=1,node=1\n12+2|3600|cpu=8,node=2\n"
    hours = parse_sacct(text, {"12": ["train", "infer", "rollout"]})
    assert hours["train"] == {"cpu_hours": 4.0, "gpu_hours": 2.0}
    assert hours["infer"] == {"cpu_hours": 1.0, "gpu_hours": 0.5}
    assert hours["rollout"] == {"cpu_hours": 8.0, "gpu_hours": 0.0}


def test_tensorboard_export_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from hpc.tensorboard import export_tensorboard

    paths = _fake_run(tmp_path / "run")
    out = export_tensorboard(paths.root, tmp_path / "tb")
    acc = EventAccumulator(str(out / "trainer-0"))
    acc.Reload()
    rewards = [(e.step, round(e.value, 6)) for e in acc.Scalars("train_step/reward_mean")]
    assert rewards == [(1, 0.1), (2, 0.2), (3, 0.3)]
    node = EventAccumulator(str(out / "rollout-n1"))
    node.Reload()
    assert [e.value for e in node.Scalars("node/episodes_per_min")] == [2.0, 3.0, 4.0]


def _run_with_rollouts(root: Path) -> RunPaths:
    """_fake_run plus run.yaml, a tokenizer, one shard per step and the checkpoints' ledgers: at step 3 the
    rewards are 1.0 and 0.0 (the best and worst of the last two steps); at step 1 a reward 5.0 sample
    (not recent: never shown); one step-3 sample dropped as zero_variance (150 generated tokens)."""
    paths = _fake_run(root)
    model = cf.write_model_dir(root.parent / "model")
    paths.run_yaml.write_text(f"config:\n  model:\n    path: {model}\n")
    tok = cf.tokenizer()
    spool = Spool(root)
    samples = {1: [("old-best", 5.0)], 2: [("mid", 0.5)], 3: [("best", 1.0), ("worst", 0.0), ("dropped", 0.0)]}
    node = MetricsWriter(root, "rollout-n2")
    for step, items in samples.items():
        writer = spool.writer(f"w{step}")
        for name, reward in items:
            writer.add_group([cf.trajectory(cf.episode(tok), name, reward)])
            node.log("episode", task_id=name, sample_index=0, attempt=0, status="ok", tokens=400, generated_tokens=150)
        shard = writer.flush()
        ckpt = paths.checkpoints / f"step_{step:06d}"
        ckpt.mkdir(parents=True)
        rows = [{"outcome": "dropped", "reason": "zero_variance"} if name == "dropped" else
                {"outcome": "trained", "step": step} for name, _ in items]
        ckpt.joinpath("ledger.jsonl").write_text("".join(
            json.dumps({**row, "shard_id": shard, "task_id": name, "trajectory_id": f"{name}:s0:a0"}) + "\n"
            for row, (name, _) in zip(rows, items, strict=True)))
    return paths


def test_page_has_summary_tokens_by_fate_and_the_best_and_worst_recent_rollouts(tmp_path: Path) -> None:
    paths = _run_with_rollouts(tmp_path / "run")
    page = write_report(paths.root).read_text()
    report = json.loads((paths.root / "report" / "report.json").read_text())
    assert report["samples"] == {"from": "trajectories trained at steps 2, 3", "best": "best:s0:a0", "worst": "worst:s0:a0"}
    # episodes: 3 x 400 generated by _fake_run, 5 x 150 here; context = 5 x (400 - 150)
    assert report["tokens_by_fate"] == {"generated": 1950, "trained": 600, "dropped": {"zero_variance": 150},
                                        "context": 1250, "not_trained_other": 1200}
    for label in ("Run", "Model", "Progress", "Wall time", "Reward", "Pass rate (trained batch)", "Episodes",
                  "Tokens by fate", "Compute", "Waste", "Configuration"):
        assert f"<th>{label}</th>" in page or f"<h2>{label}</h2>" in page, label
    # no task_ids in these train_step records: the first-vs-last reward is the trained batch's, and says so
    assert ('0.20</span> (mean of the first 3 steps) &rarr; <b class="num">0.20</b> (last 3), over the trained '
            "batch (after filters)") in page
    assert "0.05</span> at step 1 &rarr; " in page and "<b>0.15</b>" in page  # pass rate first -> last
    assert "Best: reward 1" in page and "Worst: reward 0" in page and "old-best" not in page
    assert page.count('<div class="role">assistant 1</div>') == 2 and "observation 1" in page
    assert f'<span class="c">{cf.TASK.replace("`", "`")}</span>' in page  # the task is context
    call = cf.CALL.replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")
    assert f'<span class="t">{call}</span>' in page  # the generated call is trained text
    assert "tests 4/4 passed" in page and "tests 0/4 passed" in page
    assert "tokens_generated" not in page and '"waste_percent"' not in page  # no raw JSON dump
    assert "http://" not in page and "https://" not in page and "src=\"data:image/png;base64," in page
