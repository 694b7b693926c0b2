"""``spoolrl rollout-server`` driven end to end by a client written from ProRL's wire format alone
(plain urllib, tests/service/wire_client.py), against ``spoolrl serve`` (the CPU engine, a tiny
random model), a real bwrap sandbox, a built-in SWE-bench-format instance and the real EVAL.

The server under test runs with ``service.timeout_s=20`` and ``service.max_pending=3``. A second
"backend" is a socket that accepts and never answers: an episode against it is deterministically
mid-RUN (sandbox open, waiting for the LLM) for as long as the test wants, which is how cancel,
admission, 504 and /stop are exercised without timing guesses.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service.wire_client import http, wait_file

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[2]
VERSION = 3
INSTANCE_ID = "spoolrl__intervals-1"
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.1",
          "spool.heartbeat_interval_s=1", "spool.shard_max_trajectories=1", "rollout.metrics_interval_s=0.5",
          "rollout.run_workers=4", "rollout.init_workers=2", "rollout.eval_workers=1", "inference.max_retries=0",
          "rollout.max_retries=0", "service.timeout_s=20", "service.max_pending=3", "service.probe_timeout_s=1"]


def builtin_instance() -> dict[str, Any]:
    """The instance as a dataset row (read as data, the way a trainer's dataset would hold it)."""
    for line in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["instance_id"] == INSTANCE_ID:
            return {**row, "data_source": "swe_bench", "trajectory_id": "traj-7"}
    raise AssertionError(f"{INSTANCE_ID} not in the built-in tasks")


class Blackhole:
    """Accepts connections and holds them unanswered until ``release()``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def release(self) -> None:
        for conn in self.held:
            conn.close()
        self.held.clear()


def _start(cmd: list[str], tmp: Path, name: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(tmp / f"{name}.log", "wb"),
                            stdin=subprocess.DEVNULL, cwd=ROOT)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from rollout_node.sandbox import bwrap_unavailable_reason

    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("raas")
    model = tmp / "model"
    subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(model)], check=True, capture_output=True)
    serve = subprocess.Popen([sys.executable, "-m", "hpc.cli", "serve", "--model", str(model), "--port", "0",
                              "--version", str(VERSION), "--threads", "1", "--ready-file", str(tmp / "ready.json")],
                             stdout=open(tmp / "serve.log", "wb"), stderr=subprocess.STDOUT)
    server = _start([sys.executable, "-m", "hpc.cli", "rollout-server", "--run", str(tmp / "run"), "--port", "0",
                     f"model.path={model}", f"sandbox.scratch_dir={tmp / 'scratch'}", *CONFIG], tmp, "server")
    try:
        engine = wait_file(tmp / "ready.json", serve, tmp / "serve.log")["url"]
        assert server.stdout is not None
        ready = json.loads(server.stdout.readline() or "null")
        assert ready, (tmp / "server.log").read_text()[-3000:]
        yield {"url": ready["url"], "token": ready["token"], "engine": engine, "tmp": tmp, "ready": ready,
               "server": server}
    finally:
        for proc in (server, serve):
            proc.terminate()
        for proc in (server, serve):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _call(stack: Any, path: str, body: Any = None, **kw: Any) -> tuple[int, dict[str, Any], dict[str, str]]:
    return http(stack["url"], path, body, token=stack["token"], **kw)


def _process_async(stack: Any, body: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: out.update(zip(("status", "body", "headers"), _call(stack, "/process", body), strict=True)))
    thread.start()
    out["thread"] = thread
    return out


def _wait(predicate: Any, what: str, limit_s: float = 60) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def check_auth_and_not_running(stack: Any) -> None:
    for method, path in (("GET", "/status"), ("POST", "/start"), ("POST", "/process"), ("POST", "/cancel"),
                         ("POST", "/add_llm_server"), ("POST", "/clear_llm_server"), ("POST", "/stop")):
        assert http(stack["url"], path, None if method == "GET" else {}, method=method)[0] == 401, path
        assert http(stack["url"], path, None if method == "GET" else {}, method=method, token="wrong")[0] == 401
    code, body, _ = _call(stack, "/process", {"instance": builtin_instance()})
    assert code == 503 and "start" in body["detail"]
    assert _call(stack, "/status")[0] == 503


def check_start_and_routing(stack: Any) -> None:
    assert _call(stack, "/start", {})[0] == 200
    assert _call(stack, "/start", {})[0] == 400  # already running
    code, body, _ = _call(stack, "/process", {"instance": builtin_instance()})
    assert code == 503 and "LLM server" in body["detail"]
    code, body, _ = _call(stack, "/add_llm_server", {"address": stack["engine"] + "/v1"})
    assert code == 200 and body["status"].startswith("Added")
    code, body, _ = _call(stack, "/process", {"instance": {**builtin_instance(), "data_source": "nope"}})
    assert code == 400 and "swe_gym" in body["detail"] and "swe_bench" in body["detail"]
    code, body, _ = _call(stack, "/process", {"instance": builtin_instance(), "sampling_params": {"top_p": 7}})
    assert code == 400 and "top_p" in body["detail"]


def check_one_episode(stack: Any) -> None:
    params = {"temperature": 0.7, "top_p": 1.0, "max_iterations": 2, "max_output_tokens": 8,
              "token_level_generation": True}
    code, res, _ = _call(stack, "/process", {"instance": builtin_instance(), "sampling_params": params,
                                            "job_id": "job-1"})
    assert code == 200, res
    assert (res["instance_id"], res["trajectory_id"], res["job_id"]) == (INSTANCE_ID, "traj-7", "job-1")
    assert res["critical_error"] is None and res["success"] is True and res["resolved"] is False
    assert res["status"] in ("ok", "truncated") and res["reward"] == 0.0 and (res["git_patch"] is None or res["git_patch"].strip() != "")
    assert res["filter"] is False and res["end_properly"] is (res["status"] == "ok")
    assert set(res["timing"]) == {"init", "run", "eval", "others"} and res["timing"]["eval"] > 0
    assert [m["role"] for m in res["messages"][:2]] == ["system", "user"]
    turns = [m for m in res["messages"] if m["role"] == "assistant"]
    assert 1 <= len(turns) <= 2 and all(1 <= len(m["token_ids"]) <= 8 for m in turns)
    assert all(len(m["logprobs"]) == len(m["token_ids"]) for m in turns)
    # the generated tokens in the messages are the trajectory's mask-1 tokens, versioned by the engine
    gen = [t for t, m in zip(res["token_ids"], res["loss_mask"], strict=True) if m == 1]
    assert gen == [t for m in turns for t in m["token_ids"]]
    assert {v for v, m in zip(res["policy_versions"], res["loss_mask"], strict=True) if m == 1} == {VERSION}
    assert res["node"] and res["attempt"] == 0 and res["previous_nodes"] == []
    plain = {"max_iterations": 1, "token_level_generation": False}
    code, res, _ = _call(stack, "/process", {"instance": builtin_instance(), "sampling_params": plain})
    assert code == 200 and not {"token_ids", "input_ids"} & {k for m in res["messages"] for k in m}  # not token-level
    code, res, _ = _call(stack, "/process", {"instance": builtin_instance(), "sampling_params": {"max_iterations": 1}})
    turn = next(m for m in res["messages"] if m["role"] == "assistant")  # token level is the server's default
    assert code == 200 and turn["input_ids"] == res["token_ids"][: len(turn["input_ids"])] and turn["token_ids"]


def check_cancel_admission_timeout_stop(stack: Any) -> None:
    hole = Blackhole()
    assert _call(stack, "/clear_llm_server", {})[1]["status"].startswith("Cleared 1")
    code, body, _ = _call(stack, "/add_llm_server", {"address": hole.url + "/v1"})
    assert code == 200 and "not answering yet" in body["status"]  # the probe timed out: registered, flagged
    hole.release()  # the probe's connection: from here on, held connections are the episodes'
    hung = _process_async(stack, {"instance": builtin_instance(), "job_id": "hang-1"})
    _wait(lambda: len(hole.held) >= 1, "the episode to reach its first LLM call")  # mid-RUN, sandbox open
    _wait(lambda: _call(stack, "/status")[1]["pending_jobs"] == 0, "the front door to see the node's claim")
    assert _call(stack, "/status")[1]["in_flight"] == 1
    _wait(lambda: _call(stack, "/status")[1]["active_run"] == 1, "the node to report the running episode")
    assert _call(stack, "/cancel", {"job_id": "hang-1"})[0] == 200
    hung["thread"].join(30)
    assert hung["status"] == 200 and hung["body"]["status"] == "cancelled" and hung["body"]["success"] is False
    # The node learns of the cancel from the spool and stops the episode: its call, still held in the blackhole
    # (never answered, never released), is abandoned by the client (connection closed), so the episode leaves RUN
    _wait(lambda: _call(stack, "/status")[1]["active_run"] == 0, "the cancelled episode to leave RUN")
    hole.release()
    assert _call(stack, "/cancel", {"job_id": "hang-1"})[0] == 404

    jobs = [_process_async(stack, {"instance": builtin_instance()}) for _ in range(3)]
    _wait(lambda: _call(stack, "/status")[1]["in_flight"] == 3, "three jobs in flight")
    code, body, headers = _call(stack, "/process", {"instance": builtin_instance()})
    assert code == 503 and int(headers["Retry-After"]) > 0  # service.max_pending=3
    code, body, _ = _call(stack, "/stop", {})
    assert code == 200 and "3 job(s) cancelled" in body["status"]
    for job in jobs:
        job["thread"].join(30)
        assert job["status"] == 503 and "stopping" in job["body"]["detail"]
    assert _call(stack, "/status")[0] == 503 and _call(stack, "/stop", {})[0] == 503
    hole.release()

    assert _call(stack, "/start", {})[0] == 200  # the backends registered before /stop come back
    late = _call(stack, "/process", {"instance": builtin_instance(), "job_id": "late-1"}, timeout=60)
    assert late[0] == 504 and "late-1" in late[1]["detail"] and "last held by node" in late[1]["detail"]
    assert late[1]["critical_error"] == "timeout" and late[1]["git_patch"] is None and late[1]["job_id"] == "late-1"
    assert _call(stack, "/status")[1]["total_timed_out"] == 1
    assert _call(stack, "/stop", {})[0] == 200
    hole.release()


def check_sigterm_mid_episode(stack: Any) -> None:
    """A time limit's SIGTERM while a call waits on an episode mid-RUN: the call is answered 503 at once
    (not when its job times out, nor after aiohttp's 60 s wait for handlers: past a Slurm grace the
    server would be SIGKILLed with the task still claimed), the server exits 0, and the episode is
    cancelled: its task is done, neither claimed nor back in ready."""
    hole = Blackhole()
    assert _call(stack, "/start", {})[0] == 200
    assert _call(stack, "/clear_llm_server", {})[0] == 200
    assert _call(stack, "/add_llm_server", {"address": hole.url + "/v1"})[0] == 200
    hole.release()  # the probe's connection
    hung = _process_async(stack, {"instance": builtin_instance(), "job_id": "term-1"})
    _wait(lambda: len(hole.held) >= 1, "the episode to reach its first LLM call")
    _wait(lambda: _call(stack, "/status")[1]["active_run"] == 1, "the node to report the running episode")
    server = stack["server"]
    server.send_signal(signal.SIGTERM)
    hung["thread"].join(30)
    assert hung["status"] == 503 and "shutting down" in hung["body"]["detail"], hung
    assert server.wait(timeout=50) == 0, (stack["tmp"] / "server.log").read_text()[-3000:]
    tasks = stack["tmp"] / "run" / "spool" / "tasks"
    claimed, ready = sorted(p.name for p in (tasks / "claimed").glob("*/*")), sorted(p.name for p in (tasks / "ready").glob("*"))
    # the node heard the cancel and ended the episode: its task is done, not released back to ready at the
    # drain deadline (where a later server on this run would run it again for nobody)
    assert claimed == [] and ready == [], (claimed, ready)
    hole.release()


def test_prorl_client_end_to_end(stack: Any) -> None:
    endpoint = json.loads((stack["tmp"] / "run" / "endpoints" / "rollout-server.json").read_text())
    assert endpoint["url"] == stack["url"] and Path(endpoint["token_file"]).read_text().strip() == stack["token"]
    check_auth_and_not_running(stack)
    check_start_and_routing(stack)
    check_one_episode(stack)
    check_cancel_admission_timeout_stop(stack)
    check_sigterm_mid_episode(stack)  # last: the server is gone after it
