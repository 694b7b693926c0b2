"""``scripts/bench_learning.py``'s arms: each is a valid demo config that sets what its arm claims.

A wrong key in an arm used to surface only when that arm's demo started, after the first ~12-minute arm."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from hpc.cli.demo_run import DEMO_OVERRIDES
from hpc.config import load_config
from tests.scripts_loader import load_script


def test_each_arm_is_a_valid_demo_config_that_sets_its_regime() -> None:
    bench = load_script("bench_learning")
    arms = bench.arm_overrides(3, 4, ["inference.temperature=0.8"])
    assert list(arms) == ["async", "sync"]
    bench.check_arms(arms, 30)
    cfg = {name: load_config(None, [*DEMO_OVERRIDES, *o]) for name, o in arms.items()}
    for c in cfg.values():
        assert c.run.seed == 3 and c.algorithm.groups_per_step == 4 and c.inference.temperature == 0.8
    assert cfg["sync"].algorithm.max_staleness == 0 and not cfg["sync"].trainer.prefetch
    assert cfg["sync"].trainer.max_tasks_outstanding == 4
    assert cfg["async"].algorithm.max_staleness > 0 and cfg["async"].trainer.prefetch
    assert cfg["async"].trainer.max_tasks_outstanding == 12


def test_a_bad_override_stops_the_bench_before_any_arm_runs() -> None:
    bench = load_script("bench_learning")
    with pytest.raises(SystemExit, match="(?s)async arm.s config is invalid.*rollout.max_staleness: unknown key"):
        bench.check_arms(bench.arm_overrides(0, 4, ["rollout.max_staleness=0"]), 30)


def test_host_cpu_busy_is_the_busy_share_of_the_trainer_window() -> None:
    bench = load_script("bench_learning")
    samples = [{"t": 100.0, "busy": 0, "total": 0}, {"t": 110.0, "busy": 50, "total": 200},
               {"t": 120.0, "busy": 230, "total": 400}, {"t": 130.0, "busy": 430, "total": 600}]
    assert bench.host_cpu_busy(samples, 110.0, 120.0) == (230 - 50) / (400 - 200)
    assert bench.host_cpu_busy(samples, 100.0, 130.0) == 430 / 600
    assert bench.host_cpu_busy(samples, 140.0, 150.0) is None, "no sample inside the window"
    assert bench.host_cpu_busy(samples[:1], 100.0, 100.0) is None


def test_the_cpu_sampler_reads_this_hosts_proc_stat(tmp_path: Path) -> None:
    bench = load_script("bench_learning")
    log = tmp_path / "arm.cpu.jsonl"
    deadline = time.monotonic() + 1.2
    with bench.sample_cpu(log):
        while time.monotonic() < deadline:  # keep one core busy: the share cannot read 0
            pass
    samples = [json.loads(x) for x in log.read_text().splitlines()]
    assert len(samples) >= 3 and all(a["total"] <= b["total"] for a, b in zip(samples, samples[1:], strict=False))
    busy = bench.host_cpu_busy(samples, samples[0]["t"], samples[-1]["t"])
    assert busy is not None and 1 / (os.cpu_count() or 1) * 0.5 < busy <= 1.0, busy
    assert bench.cpu_log_of(tmp_path / "async") == tmp_path / "async.cpu.jsonl"


def test_staleness_arms_are_valid_demo_configs_with_their_lag_as_the_limit() -> None:
    bench = load_script("bench_learning")
    arms = bench.stale_arms([0, 1], [0, 1, 2, 4])
    assert len(arms) == 14 and not any(a.lag == 0 and not a.is_weight for a in arms), "lag 0: only with the weight"
    assert [(a.lag, a.is_weight) for a in arms[:4]] == [(0, True), (0, True), (1, True), (1, True)], "seeds adjacent"
    bench.check_arms({a.name: a.overrides(4, ["inference.temperature=0.8"]) for a in arms}, 44)
    for arm in arms:
        c = load_config(None, [*DEMO_OVERRIDES, *arm.overrides(4, [])])
        assert c.algorithm.max_staleness == arm.lag and c.trainer.keep_policies > arm.lag and c.run.seed == arm.seed
        assert c.trainer.max_tasks_outstanding == 4 and not c.trainer.prefetch and c.trainer.publish_every == 1
        launcher = arm.launcher()
        assert launcher[1].endswith("scripts/stale_demo.py") and launcher[launcher.index("--lag") + 1] == str(arm.lag)
        assert ("--no-is-weight" in launcher) == (not arm.is_weight) and launcher[-1] == "--"
    assert len({a.name for a in arms}) == len(arms)


def test_each_policy_versions_reward_is_that_of_the_batch_drawn_from_it() -> None:
    bench = load_script("bench_learning")
    steps = [{"step": 1, "reward_mean": 0.1, "staleness_hist": {"0": 8}},  # version 0 (the initial model)
             {"step": 2, "reward_mean": 0.2, "staleness_hist": {"1": 8}},  # trained at v1, drawn by v0 again
             {"step": 3, "reward_mean": 0.3, "staleness_hist": {"2": 8}},  # v2 on samples of v0: lag 2 reached
             {"step": 4, "reward_mean": 0.4, "staleness_hist": {"2": 8}},  # v3 on samples of v1
             {"step": 5, "reward_mean": 0.5, "staleness_hist": {"1": 4, "2": 4}}]  # mixed: no one version
    rewards, mixed = bench.version_rewards(steps)
    assert rewards == {0: pytest.approx(0.2), 1: 0.4} and mixed == 1, "the initial model drew 3 batches: their mean"
    assert bench.version_rewards([{"step": 3, "reward_mean": 1.0, "staleness_hist": {"0": 2}}])[0] == {2: 1.0}


def test_the_lagged_source_names_the_version_lag_behind_latest(tmp_path: Path) -> None:
    from hpc.paths import RunPaths
    from hpc.records import write_policy_latest
    from train_node.infer.weights import RunDirPolicySource

    stale = load_script("stale_demo")
    paths = RunPaths(tmp_path)
    source = stale.LaggedSource(RunDirPolicySource(tmp_path), 2)
    assert source.latest() is None, "nothing published: the initial model"
    for v in (1, 2, 3, 4):
        paths.policy_version(v).mkdir(parents=True)
        (paths.policy_version(v) / "config.json").write_text("{}")
    write_policy_latest(paths, 2)
    assert source.latest() is None, "LATEST 2, lag 2: still version 0"
    write_policy_latest(paths, 4)
    ref = source.latest()
    assert ref is not None and (ref.version, ref.path) == (2, paths.policy_version(2))
    (paths.policy_version(2) / "config.json").unlink()
    assert source.latest() is None, "a version retention removed is never offered"
    assert stale.LaggedSource(RunDirPolicySource(tmp_path), 0).latest().version == 4


def test_without_the_is_weight_the_gradient_is_plain_reinforce_and_the_ratios_are_still_logged() -> None:
    import torch

    from train_node.trainer.loss import LossParams, policy_loss

    stale = load_script("stale_demo")
    torch.manual_seed(0)
    logits = torch.randn(12, requires_grad=True)
    def logp() -> torch.Tensor:  # a fresh graph for each loss
        return torch.nn.functional.logsigmoid(logits)

    behaviour = (logp() + 0.5 * torch.randn(12)).detach()  # a stale behaviour policy: ratios far from 1
    adv, mask = torch.randn(12), torch.ones(12)
    params = LossParams(tis_cap=2.0)
    loss, sums = stale.without_is_weight(policy_loss)(logp(), behaviour, adv, mask, params=params, total_tokens=12.0)
    (grad,) = torch.autograd.grad(loss, logits)
    now = logp()
    plain, _ = policy_loss(now, now.detach(), adv, mask, params=params, total_tokens=12.0)  # mu = pi: w = 1
    (want,) = torch.autograd.grad(plain, logits)
    weighted, seen = policy_loss(logp(), behaviour, adv, mask, params=params, total_tokens=12.0)
    (with_is,) = torch.autograd.grad(weighted, logits)
    assert torch.allclose(grad, want) and not torch.allclose(grad, with_is)
    assert sums.weight == 12.0 and sums.ratio_dev == seen.ratio_dev > 1.0 and sums.truncated == seen.truncated
    assert sums.loss == pytest.approx(float(plain.detach()) * 12.0)
