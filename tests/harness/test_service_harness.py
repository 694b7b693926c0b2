"""``rollout-server`` with ``rollout.policy: harness``: ``/process`` runs the configured harness.

Through real HTTP: the ``spoolrl rollout-server`` command (its own rollout node, a bwrap sandbox per
episode, the gateway and its relay, the real EVAL) runs the stand-in harness (``tests/harness/standin``,
installed by ``spoolrl harness install``), which truncates its history once, so the episode has two
segments. The LLM is a STAND-IN (no model here): a ``/v1/completions`` server answering call ``i`` with
scripted reply ``i`` in the tiny model's tokens, recording every prompt and completion.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from tokenizers import Tokenizer

from rollout_node.pipeline.agentscript import bash
from tests.harness.test_harness_node import RIGHT_FIX, TASK
from tests.loopback_http import RecordingLLM

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[2]
REPLIES = [bash("echo first"), bash("@truncate"), RIGHT_FIX, bash("@done")]
SAMPLING = {"temperature": 0.8, "top_p": 1.0, "max_output_tokens": 200}


def scripted_llm(tokenizer: Tokenizer) -> RecordingLLM:
    """Call ``i`` gets ``REPLIES[i]`` + ``<|im_end|>`` (the last one from then on); logprob -0.3 - 0.001 * j
    for token j."""
    end = tokenizer.token_to_id("<|im_end|>")
    assert end is not None, "the tokenizer has no <|im_end|>"
    replies = [[*tokenizer.encode(r, add_special_tokens=False).ids, end] for r in REPLIES]
    return RecordingLLM(lambda _prompt, call: replies[min(call, len(replies) - 1)], logprob0=-0.3, max_model_len=8192)


def instance() -> dict[str, Any]:
    rows = [json.loads(line) for line in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines()]
    return {**next(r for r in rows if r["instance_id"] == TASK), "data_source": "swe_gym"}


async def process(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession(url, timeout=aiohttp.ClientTimeout(total=300)) as s:
        async with s.post("/start") as resp:
            assert resp.status in (200, 400), await resp.text()
        async with s.post("/process", json=body) as resp:
            return resp.status, await resp.json()


@pytest.fixture
def scratch() -> Iterator[Path]:
    """The node's scratch directory, short: the gateway's socket path under it must fit a Unix socket's 107
    bytes, which a pytest-xdist worker's tmp_path (one directory deeper) leaves no room for."""
    path = Path(tempfile.mkdtemp(prefix="spoolrl-svc-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_process_runs_the_harness_and_answers_with_every_segment(tmp_path: Path, scratch: Path,
                                                                 standin_prefix: Path) -> None:
    model = tmp_path / "model"
    subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(model)], check=True, capture_output=True)
    llm = scripted_llm(Tokenizer.from_file(str(model / "tokenizer.json")))
    backend = llm.serve()
    log = open(tmp_path / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpc.cli", "rollout-server", "--run", str(tmp_path / "run"), "--host", "127.0.0.1",
         "--port", "0", "--trust-network", "127.0.0.1/32", f"model.path={model}",
         f"sandbox.scratch_dir={scratch}", "trainer.precision=fp32", "slurm.train.gpus_per_node=0",
         "spool.poll_interval_s=0.1", "spool.heartbeat_interval_s=1", "rollout.metrics_interval_s=0.5",
         "inference.max_retries=0", "rollout.max_retries=0", "rollout.policy=harness",
         f"rollout.harness.prefix={standin_prefix}", "rollout.harness.command=standin-harness",
         f"service.llm_server={backend}/v1"],
        stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "null")
        assert ready, (tmp_path / "server.log").read_text()[-3000:]
        code, res = asyncio.run(process(ready["url"], {"instance": instance(), "sampling_params": SAMPLING,
                                                       "job_id": "harness-job"}))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    assert code == 200, res
    # the harness ran: its fix was evaluated (reward 1), answered once with the whole episode
    assert (res["status"], res["reward"], res["resolved"], res["success"]) == ("ok", 1.0, True, True), res.get("error")
    assert "self.start <= x < self.end" in res["git_patch"]
    assert len(llm.seen) == 4 and len(res["segments"]) == 2
    # per-request sampling reached the gateway's session
    assert {(r["temperature"], r["top_p"]) for r in llm.seen} == {(SAMPLING["temperature"], SAMPLING["top_p"])}
    assert all(r["max_tokens"] <= SAMPLING["max_output_tokens"] for r in llm.seen)
    # every assistant message, in call order, is exactly what the backend saw and produced, from its own segment
    assistant = [m for m in res["messages"] if m["role"] == "assistant"]
    assert [m["segment"] for m in assistant] == [0, 0, 1, 1]
    for m, record in zip(assistant, llm.seen, strict=True):
        assert (m["input_ids"], m["token_ids"]) == (record["prompt"], record["token_ids"])
        assert m["logprobs"] == pytest.approx(record["logprobs"], abs=1e-6)
        segment = res["segments"][m["segment"]]["token_ids"]
        assert segment[: len(m["input_ids"]) + len(m["token_ids"])] == m["input_ids"] + m["token_ids"]
    assert "@truncate" in assistant[1]["content"] and "intervals/interval.py" in assistant[2]["content"]
    # the second segment restarts from the task: its prompt is not an extension of the first
    assert assistant[2]["input_ids"][: len(assistant[1]["input_ids"])] != assistant[1]["input_ids"]
    assert res["token_ids"] == res["segments"][1]["token_ids"]
