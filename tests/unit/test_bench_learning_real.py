"""``scripts/bench_learning_real.py`` without running it: every phase is a valid demo config, the arms differ only
in their control key, the held-out evaluation trains nothing, and the sizing keeps the bench within its budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc.cli.demo_run import DEMO_OVERRIDES
from hpc.config import load_config
from hpc.config.base import to_dict
from tests.scripts_loader import load_script


def test_phases_are_valid_demo_configs_and_arms_differ_only_in_their_control(tmp_path: Path) -> None:
    bench = load_script("bench_learning_real")
    args = bench.parse_args(["--k", "3", "--layers", "2"])
    model = tmp_path / "m"
    arms = {name: to_dict(load_config(None, [*DEMO_OVERRIDES, *bench.train_overrides(model, args, 10), *extra]))
            for name, extra in bench.ARMS.items()}
    real = arms["real"]
    assert real["tasks"]["source"] == "builtin-lookup" and real["trainer"]["trainable_layers"] == 2
    assert real["trainer"]["lr"] == args.lr > 0
    # every arm is pulled to the warm start by the same exact forward KL; the evaluations have none
    assert (real["algorithm"]["kl_coef"], real["algorithm"]["kl_estimator"]) == (0.1, "forward") == \
        (arms["shuffled"]["algorithm"]["kl_coef"], arms["shuffled"]["algorithm"]["kl_estimator"])
    no_kl = load_config(None, [*DEMO_OVERRIDES, *bench.train_overrides(model, bench.parse_args(["--kl-coef", "0"]), 1)])
    assert no_kl.algorithm.kl_coef == 0
    assert arms["lr0"]["trainer"]["lr"] == 0 and arms["shuffled"]["algorithm"]["control_shuffle_rewards"]

    def differing(a: dict, b: dict) -> set[str]:
        return {f"{s}.{k}" for s in a for k in a[s] if a[s][k] != b[s][k]} if isinstance(a, dict) else set()

    assert differing(real, arms["lr0"]) == {"trainer.lr"}
    assert differing(real, arms["shuffled"]) == {"algorithm.control_shuffle_rewards"}
    ev = load_config(None, [*DEMO_OVERRIDES, *bench.eval_overrides(model, model, args)])
    assert ev.tasks.source == "builtin-lookup-heldout" and ev.trainer.lr == 0 and ev.algorithm.group_size == 3
    assert ev.algorithm.groups_per_step == 32 and ev.tasks.epochs == 1 and not ev.algorithm.drop_zero_variance
    assert ev.algorithm.kl_coef == 0
    warm = bench.warm_spec(args)  # every phase prompts the model as the format warm start fitted it
    assert warm.trainable_layers == 2 and warm.steps == args.warm_steps
    for rollout in (real["rollout"], to_dict(ev)["rollout"]):
        assert (rollout["system_prompt"], rollout["max_turns"], rollout["max_new_tokens_per_turn"]) == \
            (warm.system_prompt, warm.max_turns, warm.max_new_tokens_per_turn)
    assert ev.inference.temperature == load_config(None, [*DEMO_OVERRIDES, *bench.train_overrides(
        model, args, 1)]).inference.temperature, "evaluated at the run's temperature"
    # a phase's episodes run together (a step's 16; an evaluation's 96, up to the engine's batch of 32)
    assert real["rollout"]["run_workers"] == args.group_size * args.groups_per_step == 16
    assert ev.rollout.run_workers == 32 == ev.inference.cpu_max_batch


def test_sizing_fits_the_budget_and_caps_each_arm_at_20_minutes() -> None:
    bench = load_script("bench_learning_real")
    args = bench.parse_args([])
    steps = bench.size_steps(30.0, 120.0, args)
    assert 3 * (steps * 30.0) + 3 * 120.0 <= args.budget_s and steps * 30.0 <= 1200
    assert bench.size_steps(10.0, 60.0, args) == args.max_steps
    assert bench.size_steps(5000.0, 60.0, args) == 1
    # measured 2026-12-06: a 77.1-s step, a 203-s evaluation and 12 s of demo start and drain per arm: 9 steps
    # without the overhead ran the arms and evaluations 3 minutes past the 45; with it, 8 fit
    assert bench.size_steps(77.1, 203.0, args) == 9
    steps = bench.size_steps(77.1, 203.0, args, overhead_s=12.1)
    assert steps == 8 and 3 * (steps * 77.1 + 12.1 + 203.0) <= args.budget_s


def test_a_pass_rate_of_0_or_1_before_rl_stops_the_bench() -> None:
    bench = load_script("bench_learning_real")
    bench.check_learnable(0.25)
    for rate in (0.0, 1.0):
        with pytest.raises(SystemExit, match="--warm-steps"):
            bench.check_learnable(rate)


def test_tune_chooses_the_lr_on_the_training_set_and_never_touches_the_heldout_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--tune``: every evaluation it runs is on ``builtin-lookup``; the best training-set pass rate wins and
    a tie goes to the smaller lr."""
    bench = load_script("bench_learning_real")
    args = bench.parse_args(["--tune", "4e-4,1e-4,2e-5", "--k", "1"])
    trained: dict[str, list[str]] = {}
    rates = {"tune-base": 0.5, "tune-lr0.0004": 0.0, "tune-lr0.0001": 0.625, "tune-lr2e-05": 0.625}
    sets: list[str] = []

    def run_demo(run: Path, steps: int, overrides: list[str]) -> float:
        trained[run.name] = overrides
        return 1.0

    def evaluate(name: str, policy: Path, tokenizer: Path, out: Path, a: object, source: str = "") -> dict:
        sets.append(source)
        return {"pass_rate": rates[name]}

    monkeypatch.setattr(bench, "run_demo", run_demo)
    monkeypatch.setattr(bench, "evaluate", evaluate)
    monkeypatch.setattr(bench, "last_policy", lambda run: run)
    assert bench.tune(tmp_path / "m", tmp_path, args) == 2e-5
    assert sets == ["builtin-lookup"] * 4
    for name, lr in (("tune-lr0.0004", "0.0004"), ("tune-lr0.0001", "0.0001"), ("tune-lr2e-05", "2e-05")):
        overrides = trained[name]
        assert overrides[-1] == f"trainer.lr={lr}" and "tasks.source=builtin-lookup" in overrides
    assert '"phase": "tuned", "lr": 2e-05' in capsys.readouterr().out
    ev = bench.eval_overrides(tmp_path, tmp_path, args, bench.TRAIN)
    assert "tasks.source=builtin-lookup" in ev and "tasks.epochs=1" in ev


def test_arms_runs_the_named_arms_in_the_bench_order_and_sizes_for_them(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("bench_learning_real")
    assert bench.parse_args([]).arms == ["real", "lr0", "shuffled"]
    assert bench.parse_args(["--arms", "shuffled,real"]).arms == ["real", "shuffled"]
    for bad in ("shuffle", ",", "real,nope"):
        with pytest.raises(SystemExit):
            bench.parse_args(["--arms", bad])
    assert "choose from real, lr0, shuffled" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # --tune trains the real arm only: --arms beside it would be ignored
        bench.parse_args(["--tune", "5e-5", "--arms", "real,lr0,shuffled"])
    assert "--arms has no effect with --tune" in capsys.readouterr().err
    assert bench.parse_args(["--tune", "5e-5"]).arms == ["real", "lr0", "shuffled"]
    one = bench.parse_args(["--arms", "shuffled"])
    assert bench.size_steps(77.1, 203.0, one) == 15  # one arm: 20 min cap, not a third of the 45
    assert bench.size_steps(77.1, 203.0, bench.parse_args([])) == 9


@pytest.mark.parametrize("bad", ["-0.1", "nan", "inf"])
def test_kl_coef_must_be_finite_and_not_negative(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    bench = load_script("bench_learning_real")
    with pytest.raises(SystemExit):
        bench.parse_args(["--kl-coef", bad])
    assert "--kl-coef must be a finite number >= 0" in capsys.readouterr().err
