"""``scripts/bench_overlap.py`` (two short cells: the real rollout node, sandboxes, spool and trainer loop with the
inference and trainer stand-ins), ``scripts/sim_overlap.py``'s validation against measured bench cells, and
``hpc.overlap``'s figures."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from hpc.overlap import busy_share, overlap_figures, run_intervals
from tests.scripts_loader import load_script

FIXTURE = Path(__file__).with_name("data") / "bench_overlap_cells.json"
SIGNAL_FIXTURE = Path(__file__).with_name("data") / "bench_overlap_signal_cells.json"  # its "note" says what ran
QUIET_FIXTURE = Path(__file__).with_name("data") / "bench_overlap_quiet_cells.json"  # its "note" says what ran
GRID_FIXTURE = Path(__file__).with_name("data") / "bench_overlap_grid_cells.json"  # its "note" says what ran


def test_two_bench_cells_train_every_task_once_publish_versions_and_print_the_min_capacity_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("bench_overlap")
    out = tmp_path / "cells.json"
    steps = 3
    assert bench.main(["--ratios", "1", "--staleness", "0", "2", "--parallel", "2", "--steps", str(steps),
                       "--warm-steps", "1", "--time-scale", "0.08", "--groups-per-step", "2", "--json-out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    full = json.loads(out.read_text())
    per_step = full["shape"]["groups_per_step"] * full["shape"]["group_size"]
    assert [(c["ratio"], c["max_staleness"]) for c in printed["cells"]] == [(1.0, 0), (1.0, 2)]
    for line, cell in zip(printed["cells"], full["cells"], strict=True):
        # the trainer stand-in publishes through the real publisher: one version per step, LATEST at the last
        assert cell["published"] == list(range(1, steps + 1)) and cell["latest_version"] == steps
        assert len(cell["versions_served"]) >= 2, "the inference stand-in never saw a new version"
        # the real consumer trains nothing twice
        assert cell["groups_trained"] == steps * full["shape"]["groups_per_step"]
        assert len(set(cell["trained_tasks"])) == len(cell["trained_tasks"]) == cell["groups_trained"]
        # the printed bound is the minimum of the capacities measured in the cell
        assert line["bound"] == min(line["rollout_capacity"], line["trainer_capacity"])
        assert line["trainer_capacity"] == pytest.approx(3600 * per_step / statistics.fmean(cell["step_s"]), rel=1e-3)
        run_mean = statistics.fmean(cell["stage_s"]["run"])
        assert line["rollout_capacity"] <= 3600 * full["shape"]["run_workers"] / run_mean * 1.001
        assert line["bound_fraction"] == pytest.approx(line["samples_per_hour"] / line["bound"], rel=1e-2)
        for key in ("trainer_idle", "inference_idle", "waste"):
            assert 0.0 <= line[key] <= 1.0, (key, line[key])
        # the idle decomposition accounts for the trainer's whole idle time, one share per cause
        assert set(cell["idle_causes"]) == set(bench.IDLE_CAUSES)
        assert sum(cell["idle_causes"].values()) == pytest.approx(cell["trainer_idle"], abs=0.02), cell["idle_causes"]
        assert len(cell["loop_s"]) == steps - 1 and all(x >= 0 for x in cell["loop_s"])
        assert cell["trainer_idle_floor"] == pytest.approx(max(0.0, 1 - line["rollout_capacity"] / line["trainer_capacity"]),
                                                           abs=1e-3)
    sync, async_ = full["cells"]
    assert set(sync["staleness_trained"]) == {"0"}, "staleness 0 trained a stale sample"
    # synchronous: the trainer waits for every step's rollouts, and inference waits for every step
    assert sync["trainer_idle"] > 0.2 and sync["inference_idle"] > 0.2, sync
    rollout = ("not_issued", "claim", "init", "run_queue", "run", "eval_queue", "eval")
    assert sum(sync["idle_causes"][k] for k in rollout) > 0.1, "synchronous idle is waiting for the rollouts"


def test_the_model_reproduces_the_measured_bench_cells() -> None:
    """Issue 35's target is every cell within 10 %. The fixture (the full bench, run at a load average of 20-50
    on the 2 cores) meets it in 17 of 20 cells replaying each cell's own measurements; the other three (ratio 2
    at staleness 1 and 2, ratio 0.5 at 4) are 11-18 % off, the model faster: this asserts what was met, so a
    model change that loses it fails."""
    sim = load_script("sim_overlap")
    checks = sim.validate(json.loads(FIXTURE.read_text()), reps=4)
    assert len(checks) == 20
    within = [c for c in checks if abs(c["error"]) <= 0.10]
    assert len(within) >= 17, checks
    assert max(abs(c["error"]) for c in checks) <= 0.20, checks
    # where the trainer is the bottleneck (ratio 4), the idle left is the loop's own time between steps, which
    # the model replays: it matches the bench's trainer idle
    for c in checks:
        if c["ratio"] == 4.0 and c["max_staleness"] >= 2:
            assert c["sim_trainer_idle"] == pytest.approx(c["bench_trainer_idle"], abs=0.01), c


def test_the_model_reproduces_the_bench_with_the_trainer_waiting_signal() -> None:
    """Measured with the signal (the fixture's note): at the default shard age (30 s), staleness 2, the bench ran
    6,244 samples/h with the signal and 3,665 without it (a step waited for its node to drain); the model, told
    which, reproduces the first within 10 % and the second within 11 % (-10.7 %), and the same gap. The ten
    cells at the bench's 0.2 s shard age and a measured ratio of 0.8-1.2 are within 10 %."""
    sim = load_script("sim_overlap")
    with_signal, without, ratio_one = json.loads(SIGNAL_FIXTURE.read_text())["runs"]
    assert with_signal["shape"]["trainer_signal"] and not without["shape"]["trainer_signal"]
    (on,), (off,) = sim.validate(with_signal, reps=4), sim.validate(without, reps=4)
    assert abs(on["error"]) <= 0.10 and abs(off["error"]) <= 0.11, (on, off)
    assert on["bench_samples_per_hour"] > 1.5 * off["bench_samples_per_hour"]
    assert on["sim_samples_per_hour"] > 1.5 * off["sim_samples_per_hour"], (on, off)
    checks = sim.validate(ratio_one, reps=4)
    assert len(checks) == 10 and all(abs(c["error"]) <= 0.10 for c in checks), checks


def test_the_model_reproduces_every_quiet_cell_with_13_step_windows() -> None:
    """Issue 35's target, every cell within 10 %, on the 12 cells measured on a quiet machine with 13 measured
    steps a cell (the fixture's note): measured 0.9 % off at worst and the trainer idle within 1 point, including
    the two runs at a nominal ratio of 1 that idled 13.0 % and 3.2 % at staleness 2."""
    sim = load_script("sim_overlap")
    checks = [c for run in json.loads(QUIET_FIXTURE.read_text())["runs"] for c in sim.validate(run, reps=4)]
    assert len(checks) == 12 and all(abs(c["error"]) <= 0.10 for c in checks), checks
    for c in checks:
        assert c["sim_trainer_idle"] == pytest.approx(c["bench_trainer_idle"], abs=0.02), c
    at_one = sorted(c["bench_trainer_idle"] for c in checks if c["ratio"] == 1.0 and c["max_staleness"] == 2)
    assert at_one == pytest.approx([0.0319, 0.1303], abs=1e-4)


def test_the_model_reproduces_every_cell_of_the_full_grid_and_the_targets_hold_at_ratio_1() -> None:
    """Issue 35 on the full grid (ratios 0.25-4 x staleness 0/1/2/4), measured on a quiet machine with 13 measured
    steps a cell once the staleness guard's margin counted whole versions only (the fixture's note): the model
    within 10 % of every cell (measured: 20 of 20, worst 3.4 %), and at ratio 1 staleness 2 >= 1.8x the
    synchronous throughput with trainer idle and waste <= 5 % (measured 2.50x, 3.2 %, 0 %)."""
    sim, bench = load_script("sim_overlap"), load_script("bench_overlap")
    (run,) = json.loads(GRID_FIXTURE.read_text())["runs"]
    checks = sim.validate(run, reps=4)
    assert len(checks) == 20 and all(abs(c["error"]) <= 0.10 for c in checks), checks
    for c in checks:
        assert c["sim_trainer_idle"] == pytest.approx(c["bench_trainer_idle"], abs=0.03), c
    summary = bench.targets(run["cells"])
    assert summary["met"], summary
    assert summary["async_over_sync"] == pytest.approx(2.50, abs=0.01)


def _one_group_sim(sim: ModuleType, age: float, signal: bool = False) -> Any:
    shape = sim.SimShape(groups_per_step=1, group_size=1, init_workers=1, run_workers=2, eval_workers=1,
                         llm_slots=2, means={"init": 0.1, "run": 1.0, "eval": 0.1}, step_s=0.5,
                         shard_max_age_s=age, poll_interval_s=0.05, steps=6, warm_steps=1, trainer_signal=signal)
    return sim.Sim(shape, sim.Dists(stage={s: [1.0] for s in sim.STAGES}, step=[1.0]), 1, seed=0)


def test_the_model_seals_a_shard_by_age_while_the_node_is_busy() -> None:
    """A complete group waits for its shard's seal while its node has more in flight (the age thread), and is
    sealed at once when the node has nothing left: a longer spool.shard_max_age_s delays the trainer."""
    sim = load_script("sim_overlap")
    fast, slow = _one_group_sim(sim, 0.1).run(), _one_group_sim(sim, 2.0).run()
    assert slow["trainer_idle"] > fast["trainer_idle"] + 0.05, (fast, slow)
    assert slow["samples_per_hour"] < 0.9 * fast["samples_per_hour"], (fast, slow)
    idle = _one_group_sim(sim, 2.0)
    idle.write(0, sim._Group(task=0, left=0))  # nothing in flight on node 0: sealed now
    assert not idle.shards[0] and idle.shard_no[0] == 1
    busy = _one_group_sim(sim, 2.0)
    busy.in_flight[0] = 1
    busy.write(0, sim._Group(task=0, left=0))  # another sample in flight: the shard waits for its age
    assert len(busy.shards[0]) == 1 and busy.shard_no[0] == 0


def test_the_model_seals_at_once_when_the_nodes_see_the_trainer_waiting() -> None:
    """With control/TRAINER_WAITING the long shard age no longer delays the trainer: a node seals its open shard
    at its next control poll after the trainer starts waiting, and every group it writes while the trainer waits."""
    sim = load_script("sim_overlap")
    fast, slow, signalled = (_one_group_sim(sim, 0.1).run(), _one_group_sim(sim, 2.0).run(),
                             _one_group_sim(sim, 2.0, signal=True).run())
    assert signalled["samples_per_hour"] > 1.1 * slow["samples_per_hour"], (slow, signalled)
    assert signalled["trainer_idle"] < slow["trainer_idle"] - 0.05, (slow, signalled)
    assert signalled["samples_per_hour"] == pytest.approx(fast["samples_per_hour"], rel=0.1), (fast, signalled)
    waits = _one_group_sim(sim, 2.0, signal=True)
    waits.in_flight[0] = 1
    waits.write(0, sim._Group(task=0, left=0))  # busy node, trainer not waiting: the shard waits for its age
    assert len(waits.shards[0]) == 1
    waits.signal_wait(True)
    while waits.shards[0]:  # the node's control poll sees the marker: sealed
        waits.now, _, fn = sim.heapq.heappop(waits.events)
        fn()
    assert waits.shard_no[0] == 1 and waits.now <= max(sim.NODE_TICK_S, waits.s.poll_interval_s)
    waits.write(0, sim._Group(task=1, left=0))  # written while the trainer waits: sealed at once
    assert not waits.shards[0] and waits.shard_no[0] == 2


def test_the_model_scales_rollout_nodes_and_drops_what_is_too_stale() -> None:
    sim = load_script("sim_overlap")
    dists, _ = sim.from_bench(json.loads(FIXTURE.read_text()))
    cells = sim.node_scaling(dists, reps=2, nodes=[1, 16], node=sim.SimShape(steps=12, warm_steps=2))
    assert cells[1]["efficiency"] >= 0.9, cells
    slow_trainer = sim.SimShape(step_s=4 * sim.SimShape().rollout_step_s())
    fresh = sim.simulate(slow_trainer, dists, 0, reps=2)
    assert fresh["waste"] == 0.0, "synchronous: nothing can be stale"


def _episode(t: float, run_s: float, eval_s: float) -> dict[str, Any]:
    return {"kind": "episode", "t": t, "timings": {"init_s": 0.1, "run_s": run_s, "eval_wait_s": 0.0, "eval_s": eval_s}}


def test_overlap_figures_from_metrics_records() -> None:
    steps = [{"kind": "train_step", "t": 12.0, "step_s": 2.0, "idle_fraction": 0.5},
             {"kind": "train_step", "t": 20.0, "step_s": 2.0, "idle_fraction": 0.4}]
    episodes = [_episode(11.0, 4.0, 1.0), _episode(17.0, 3.0, 0.0)]  # RUN [6, 10] and [14, 17]
    assert run_intervals(episodes) == [(6.0, 10.0), (14.0, 17.0)]
    figures = overlap_figures([*steps, *episodes])
    # window [10, 20]: steps busy 4 of 10 s; RUN busy [14, 17] = 3 of 10 s
    assert figures == {"trainer_wait_ratio": 0.4, "trainer_idle": 0.6, "inference_idle": 0.7}
    assert overlap_figures(episodes) == {"trainer_wait_ratio": None, "trainer_idle": None, "inference_idle": None}
    assert busy_share([(0, 2), (1, 3), (5, 6)], 0, 10) == pytest.approx(0.4)


def test_the_report_shows_the_idle_figures_of_the_run(tmp_path: Path) -> None:
    from hpc.config import load_config
    from hpc.metrics import MetricsWriter, read_metrics
    from hpc.report import write_report
    from hpc.rundir import create_run

    paths = create_run(tmp_path / "run", load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0"]))
    trainer, node = MetricsWriter(paths.root, "trainer-0"), MetricsWriter(paths.root, "rollout-n0")
    for step in (1, 2):
        trainer.log("train_step", step=step, step_s=0.5, idle_fraction=0.25 * step, reward_mean=0.5, pass_rate=0.5)
        node.log("episode", task_id=f"t{step}", sample_index=0, attempt=0, status="ok", tokens=10, generated_tokens=5,
                 timings={"run_s": 0.2, "eval_s": 0.1})
    trainer.close()
    node.close()
    page = write_report(paths.root).read_text()
    report = json.loads((paths.root / "report" / "report.json").read_text())
    assert report["overlap"] == overlap_figures(read_metrics(paths.root))
    assert report["overlap"]["trainer_wait_ratio"] == 0.5 and report["overlap"]["trainer_idle"] is not None
    assert "<th>Idle (hpc.overlap)</th>" in page and "trainer wait ratio" in page and "50.0 %" in page


def test_the_model_runs_a_groups_shared_diff_once_and_its_sibling_waits_for_it() -> None:
    sim = load_script("sim_overlap")
    shape = sim.SimShape(group_size=2, means={"init": 0.1, "run": 1.0, "eval": 0.5}, eval_dedup=True)
    model = sim.Sim(shape, sim.Dists(stage={s: [1.0] for s in sim.STAGES}, step=[1.0]), 1, seed=0)
    group = sim._Group(task=0, left=2)
    model.start(0, "eval", group)  # the first sample runs the tests: 0.5 s
    model.now = 0.2
    model.start(0, "eval", group)  # its sibling holds a worker until that result: 0.3 s more
    assert sorted(t for t, _, _ in model.events) == pytest.approx([0.5, 0.5])
    model.now = 0.7
    model.start(0, "eval", group)  # after the result: no wait
    assert max(t for t, _, _ in model.events) == pytest.approx(0.7)
