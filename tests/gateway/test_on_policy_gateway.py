"""The CPU engine's tiny model behind the gateway, trained by the DeepSpeed trainer: trajectories a
harness samples through the gateway at T = 0.7 (three calls per episode, the history resent each
time, so each episode is one segment of several turns) have importance ratio 1 within 1e-4 (the
measure of tests/infer/test_on_policy.py, whose run + engine + trainer step this reuses; its negative
control shows the measure fails for samples scored at the wrong temperature)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from openai.types.chat import ChatCompletionMessageParam

from hpc.trajectory import Trajectory
from rollout_node.agent.client import InferenceClient
from rollout_node.agent.seeds import EpisodeSeed
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway import Gateway, GatewaySampling, SessionTrace
from tests.gateway.gw_helpers import as_history, sdk
from tests.infer.infer_helpers import first_train_step

pytestmark = pytest.mark.deepspeed
T = 0.7
GROUPS, SAMPLES, CALLS = 4, 2, 3


def _episode(gateway: Gateway, client: InferenceClient, template: ChatTemplate, g: int, i: int) -> SessionTrace:
    key = f"task{g}/{i}"
    sampling = GatewaySampling(temperature=T, max_new_tokens=12, max_tokens=1024, seed=EpisodeSeed(0, f"task{g}", i))
    session = gateway.open_session(key, client.session(key), template, sampling)
    api = sdk(session)
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": "You are an agent."},
                                                  {"role": "user", "content": f"Solve task {g}."}]
    for turn in range(CALLS):
        if turn == 1:  # a streamed answer, reassembled as a harness does
            chunks = list(api.chat.completions.create(model="policy", messages=messages, temperature=T, max_tokens=12,
                                                      stream=True))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            messages.append({"role": "assistant", "content": text})
        else:
            answer = api.chat.completions.create(model="policy", messages=messages, temperature=T, max_tokens=12)
            messages.append(as_history(answer.choices[0].message))
        messages.append({"role": "user", "content": f"observation {turn}"})
    return session.close()


def _sample(url: str, model_dir: Path, tmp: Path) -> list[list[Trajectory]]:
    template = ChatTemplate.from_model_dir(model_dir)
    client = InferenceClient([url], seed=0)
    groups = []
    with Gateway(tmp / "gw.sock") as gateway, ThreadPoolExecutor(GROUPS * SAMPLES) as pool:  # the engine batches them
        futures = {(g, i): pool.submit(_episode, gateway, client, template, g, i)
                   for g in range(GROUPS) for i in range(SAMPLES)}
        for g in range(GROUPS):
            group = []
            for i in range(SAMPLES):
                trace = futures[g, i].result()
                assert trace.error is None and trace.calls == CALLS and trace.logprob_kind == "processed"
                (seg,) = trace.segments  # the history was resent unchanged: one training sequence
                assert sum(seg.loss_mask) > CALLS and set(np.asarray(seg.policy_versions)[np.asarray(seg.loss_mask) == 1]) == {0}
                group.append(Trajectory(
                    trajectory_id=f"task{g}/{i}", task_id=f"task{g}", group_id=f"task{g}", sample_index=i,
                    token_ids=np.asarray(seg.token_ids, np.int32), loss_mask=np.asarray(seg.loss_mask, np.int8),
                    logprobs=np.asarray(seg.logprobs, np.float32),
                    policy_versions=np.asarray(seg.policy_versions, np.int32), reward=float(i),
                    logprob_kind=trace.logprob_kind, sampling=trace.sampling))
            groups.append(group)
    client.close()
    return groups


def test_gateway_trajectories_are_on_policy_at_temperature_07(tmp_path: Path) -> None:
    step = first_train_step(tmp_path, "run", lambda url, model: _sample(url, model, tmp_path))
    assert step["samples"] == GROUPS * SAMPLES and step["by_staleness"]["0"]["tokens"] == step["loss_tokens"] > 0
    print(f"gateway on-policy ratio_dev at T={T}: {step['ratio_dev']:.2e}")
    assert step["ratio_dev"] < 1e-4, step
    assert step["truncated_fraction"] == 0.0 and np.isfinite(step["grad_norm"])
