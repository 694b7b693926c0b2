"""The smoke version of ``scripts/bench_learning_real.py`` (the real-model bench stays a benchmark): SmolLM2-135M
converted from its GGUF by ``spoolrl model from-gguf``, then 2 steps of the bench's training config through
``spoolrl demo`` (CPU engine, agent, bwrap sandboxes, EVAL, spool, DeepSpeed with ``trainer.trainable_layers``),
with the shuffled-rewards control on so that its switch is exercised too. It asserts the plumbing, not learning:
the conversion and its chat template, finite steps, a policy published and reloaded by the engine after each step,
episodes sampled on builtin-lookup with the real tokenizer's template. Measured: 452 s on the shared 2-core
host (load ~17, beside a bench run), most of it the 135M model's generation on CPU; far above the 60 s it should
take, so it is marked e2e."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from hpc.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_learning_real", ROOT / "scripts" / "bench_learning_real.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_learning_real", module)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(900)
def test_two_steps_of_the_real_bench_through_every_part(tmp_path: Path) -> None:
    from rollout_node.agent.template import ChatTemplate

    bench = _bench()
    model = bench.convert_model(tmp_path)
    info = json.loads((model / "config.json").read_text())
    assert info["architectures"] == ["LlamaForCausalLM"] and info["num_hidden_layers"] == 30
    template = ChatTemplate.from_model_dir(model)
    assert template.decode([template.im_end], skip_special_tokens=False) == "<|im_end|>"
    args = bench.parse_args(["--layers", "1", "--group-size", "2", "--groups-per-step", "1", "rollout.max_turns=2",
                             "rollout.max_new_tokens_per_turn=24", "rollout.run_workers=2",
                             "algorithm.control_shuffle_rewards=true"])
    run = tmp_path / "run"
    bench.run_demo(run, 2, bench.train_overrides(model, args, 2))
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    assert [s["step"] for s in steps] == [1, 2] and all(math.isfinite(s["loss"]) for s in steps), steps
    reloads = {int(r["version"]) for r in read_metrics(run, "reload")}
    assert {1, 2} <= reloads, f"the engine reloads every published policy: {sorted(reloads)}"
    assert bench.last_policy(run).name == "v000002"
    episodes = list(read_metrics(run, "episode"))
    assert len(episodes) >= 4 and all(e["task_id"].startswith("spoolrl__lookup-") for e in episodes)
    assert all(e["generated_tokens"] > 0 for e in episodes)
    rate, n = bench.pass_rate(run)
    assert n == len({(e["task_id"], e["sample_index"]) for e in episodes}) and 0.0 <= rate <= 1.0
