"""The smoke version of ``scripts/bench_learning_real.py`` (the real-model bench stays a benchmark): SmolLM2-135M
converted from its GGUF by ``spoolrl model from-gguf`` (the bench's conversion, cached under
``$SPOOLRL_CACHE/converted/``: made by the CLI on the first run), then 2 steps of the bench's training config
through ``spoolrl demo`` (CPU engine, agent, bwrap sandboxes, EVAL, spool, DeepSpeed with
``trainer.trainable_layers``), with the shuffled-rewards control on so that its switch is exercised too. It asserts
the plumbing, not learning: the conversion and its chat template, finite steps, each published policy reloaded by
the engine (step 2 sampled by version 1: ``algorithm.max_staleness`` 0), episodes sampled on builtin-lookup with the
real tokenizer's template. As small as the plumbing allows: 1 group of 2 samples, 1 turn of 8 tokens, the top block
trained, no warm start (the converted model itself; the bench's warm start is cached and tested by
tests/unit/test_bench_learning_real.py's configs and the README's runs). Its time is in the README's test
section."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from hpc.metrics import read_metrics
from tests.scripts_loader import load_script

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]


@pytest.mark.timeout(900)
def test_two_steps_of_the_real_bench_through_every_part(tmp_path: Path) -> None:
    from rollout_node.agent.template import ChatTemplate

    bench = load_script("bench_learning_real")
    model = bench.convert_model()
    info = json.loads((model / "config.json").read_text())
    assert info["architectures"] == ["LlamaForCausalLM"] and info["num_hidden_layers"] == 30
    template = ChatTemplate.from_model_dir(model)
    assert template.decode([template.im_end], skip_special_tokens=False) == "<|im_end|>"
    assert bench.convert_model() == model, "the conversion is made once and reused"
    args = bench.parse_args(["--layers", "1", "--group-size", "2", "--groups-per-step", "1", "rollout.max_turns=1",
                             "rollout.max_new_tokens_per_turn=8", "rollout.run_workers=2", "rollout.eval_workers=1",
                             "algorithm.max_staleness=0", "algorithm.control_shuffle_rewards=true"])
    run = tmp_path / "run"
    bench.run_demo(run, 2, bench.train_overrides(model, args, 2))
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) for s in steps), steps
    assert all(math.isfinite(s["grad_norm"]) for s in steps) and steps[-1]["nonfinite_steps"] == 0, steps
    assert steps[1]["staleness_hist"] == {"0": 2}, "step 2 was sampled by version 1: the engine reloaded it"
    reloads = sorted({int(r["version"]) for r in read_metrics(run, "reload")})
    assert reloads == [1, 2], f"the engine reloads each published policy: {reloads}"
    assert bench.last_policy(run).name == "v000002"
    episodes = list(read_metrics(run, "episode"))
    assert len(episodes) >= 4 and all(e["task_id"].startswith("spoolrl__lookup-") for e in episodes)
    assert all(e["generated_tokens"] > 0 for e in episodes)
    rate, n = bench.pass_rate(run)
    assert n == len({(e["task_id"], e["sample_index"]) for e in episodes}) and 0.0 <= rate <= 1.0
