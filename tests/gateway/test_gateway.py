"""The gateway through the real OpenAI SDK over its Unix socket, a recording stand-in backend behind it.

What is checked: the IDs the trace records are exactly the prompts the gateway sent and the IDs the
backend returned; an unchanged history is one segment, a truncated or edited one starts another;
SSE and plain answers agree; 16 sessions at once stay apart; keys; sampling the trainer cannot
reproduce is a 400; backend failures are 502 and recorded as infrastructure.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCallParam, ChatCompletionMessageParam
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from rollout_node.agent.client import InferenceClient, RetryPolicy
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway import Gateway, GatewaySampling, GatewaySession, SessionTrace
from tests.gateway.gw_helpers import TOOLS, RecordingBackend, as_history, assert_exact, sdk

SAMPLING = GatewaySampling(temperature=0.7, max_new_tokens=64, max_tokens=4096)


def _open(gateway: Gateway, client: InferenceClient, template: ChatTemplate, name: str,
          sampling: GatewaySampling = SAMPLING) -> GatewaySession:
    return gateway.open_session(name, client.session(name), template, sampling)


def _conversation(task: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": task}]


def _streamed_call(tc: ChoiceDeltaToolCall) -> ChatCompletionMessageFunctionToolCallParam:
    """A streamed tool call as the harness sends it back."""
    assert tc.id is not None and tc.function is not None, "a streamed tool call without its id or function"
    assert tc.function.name is not None and tc.function.arguments is not None
    return {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": tc.function.arguments}}


def _turns(api: openai.OpenAI, messages: list[ChatCompletionMessageParam], n: int, *, stream: bool = False) -> list[Any]:
    """``n`` calls of a harness that resends its history unchanged, answering each tool call."""
    answers: list[Any] = []
    for i in range(n):
        if stream:
            chunks = list(api.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                      stream_options={"include_usage": True}))
            answers.append(chunks)
            calls = [_streamed_call(tc) for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            messages.append({"role": "assistant", "content": content, "tool_calls": calls})
            call_ids = [call["id"] for call in calls]
        else:
            answer = api.chat.completions.create(model="m", messages=messages, tools=TOOLS, temperature=0.7,
                                                 max_completion_tokens=200)
            answers.append(answer)
            messages.append(as_history(answer.choices[0].message))
            call_ids = [call.id for call in answer.choices[0].message.tool_calls or []]
        for call_id in call_ids:
            messages.append({"role": "tool", "tool_call_id": call_id, "content": f"out {i}\ncalc.py"})
    return answers


def test_unchanged_history_is_one_token_exact_segment(gateway: Gateway, client: InferenceClient,
                                                      template: ChatTemplate, backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "one-segment")
    api = sdk(session)
    answers = _turns(api, _conversation("Fix calc.py"), 3)
    first = answers[0]
    assert first.choices[0].finish_reason == "tool_calls" and first.choices[0].message.content == "Listing."
    (call,) = first.choices[0].message.tool_calls
    assert call.function.name == "bash" and call.function.arguments == '{"command": "ls"}'
    assert first.usage.prompt_tokens == len(backend.records()[before]["prompt"])
    assert [m.id for m in api.models.list().data] == ["policy"]
    trace = session.close()
    records = backend.records()[before:]
    assert len(records) == 3 and trace.calls == 3
    assert len(trace.segments) == 1 and trace.reprefill_tokens == 0 and trace.error is None
    assert_exact(trace.segments[0], records)
    assert trace.logprob_kind == "processed" and trace.sampling["temperature"] == 0.7
    assert trace.llm_s > 0 and trace.gateway_s > 0


def test_streamed_answers_equal_plain_ones_and_stay_one_segment(
        gateway: Gateway, client: InferenceClient, template: ChatTemplate, backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "sse")
    streams = _turns(sdk(session), _conversation("Fix calc.py"), 2, stream=True)
    for chunks in streams:
        assert chunks[0].choices[0].delta.role == "assistant"
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
        assert chunks[-1].usage is not None and not chunks[-1].choices
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Listing."
    trace = session.close()
    records = backend.records()[before:]
    assert len(trace.segments) == 1 and len(records) == 2
    assert_exact(trace.segments[0], records)
    assert streams[-1][-1].usage.completion_tokens == len(records[-1]["token_ids"])


def test_raw_sse_wire_format_ends_with_done(gateway: Gateway, client: InferenceClient, template: ChatTemplate) -> None:
    session = _open(gateway, client, template, "raw-sse")
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(session.socket_path))) as http:
        resp = http.post("http://gateway/v1/chat/completions", headers={"Authorization": f"Bearer {session.key}"},
                         json={"model": "m", "messages": _conversation("hi"), "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = [e for e in resp.text.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    session.close()


def test_truncated_history_is_two_segments(gateway: Gateway, client: InferenceClient, template: ChatTemplate,
                                           backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "truncated")
    api = sdk(session)
    messages = _conversation("Fix calc.py")
    _turns(api, messages, 2)
    # the harness compacts: system + a summary, dropping the exchanges so far
    short: list[ChatCompletionMessageParam] = [messages[0], {"role": "user", "content": "Summary: ran ls twice. Continue."}]
    _turns(api, short, 2)
    trace = session.close()
    records = backend.records()[before:]
    assert len(records) == 4 and len(trace.segments) == 2
    assert_exact(trace.segments[0], records[:2])
    assert_exact(trace.segments[1], records[2:])
    shared = 0
    while records[1]["prompt"][shared] == records[2]["prompt"][shared]:
        shared += 1
    assert trace.reprefill_tokens == shared > 0  # the system message's tokens are prefilled again
    assert trace.generated_tokens == sum(len(r["token_ids"]) for r in records)


def test_edited_assistant_message_starts_a_new_segment(gateway: Gateway, client: InferenceClient,
                                                       template: ChatTemplate, backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "edited")
    api = sdk(session)
    messages = _conversation("Fix calc.py")
    _turns(api, messages, 1)
    messages[2]["content"] = "Listing the files."  # the harness rewrote what the model said
    _turns(api, messages, 1)
    trace = session.close()
    records = backend.records()[before:]
    assert len(trace.segments) == 2
    assert_exact(trace.segments[1], records[1:])
    # the edit is rendered as text: its tokens are context (mask 0) in the second segment's prompt
    assert template.decode(records[1]["prompt"]).count("Listing the files.") == 1


def test_sixteen_sessions_at_once(gateway: Gateway, client: InferenceClient, template: ChatTemplate) -> None:
    sessions = [_open(gateway, client, template, f"many-{i}") for i in range(16)]
    assert len({s.key for s in sessions}) == 16
    errors: list[BaseException] = []
    start = threading.Barrier(16)

    def harness(i: int) -> None:
        try:
            start.wait(60)
            _turns(sdk(sessions[i]), _conversation(f"task number {i} marker{i}x"), 3)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=harness, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    traces = [s.close() for s in sessions]
    for i, trace in enumerate(traces):
        assert trace.calls == 3 and len(trace.segments) == 1 and trace.error is None
        text = template.decode(trace.segments[0].token_ids)
        assert f"marker{i}x" in text and sum(f"marker{j}x" in text for j in range(16)) == 1


def test_keys_open_only_their_own_open_session(gateway: Gateway, client: InferenceClient, template: ChatTemplate) -> None:
    a, b = _open(gateway, client, template, "key-a"), _open(gateway, client, template, "key-b")
    _turns(sdk(a), _conversation("only for a"), 1)
    with pytest.raises(openai.AuthenticationError):
        sdk(a, key="sk-spoolrl-not-a-session").chat.completions.create(model="m", messages=_conversation("x"))
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(a.socket_path))) as http:  # no Authorization header
        assert http.get("http://gateway/v1/models").status_code == 401
    trace_a = a.close()
    for call in (lambda: sdk(a).chat.completions.create(model="m", messages=_conversation("late")),
                 lambda: sdk(a).models.list()):
        with pytest.raises(openai.AuthenticationError) as err:
            call()
        assert err.value.status_code == 401 and "session key" in str(err.value)
    assert trace_a.calls == 1
    _turns(sdk(b), _conversation("only for b"), 1)  # b is untouched by a's key and its end
    trace_b = b.close()
    assert trace_b.calls == 1 and "only for a" not in template.decode(trace_b.segments[0].token_ids)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"temperature": 0}, "temperature"),
    ({"top_p": 0.9}, "top_p"),
    ({"temperature": 1.0}, "temperature"),  # reproducible, but not the run's temperature
    ({"n": 2}, "n"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"extra_body": {"top_k": 40}}, "top_k"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
])
def test_unreproducible_sampling_is_a_clear_400(gateway: Gateway, client: InferenceClient, template: ChatTemplate,
                                                backend: RecordingBackend, kwargs: dict[str, Any], param: str) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, f"bad-{param}")
    with pytest.raises(openai.BadRequestError) as err:
        sdk(session).chat.completions.create(model="m", messages=_conversation("x"), **kwargs)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and param in body["message"]
    trace = session.close()
    assert trace.calls == 0 and not trace.segments and len(backend.records()) == before
    assert trace.refused is not None and trace.refused.startswith(f"HTTP 400 on {param}: ")  # the episode's reason


def test_context_budget_is_the_agents_outcome(gateway: Gateway, client: InferenceClient, template: ChatTemplate) -> None:
    session = _open(gateway, client, template, "budget", GatewaySampling(temperature=0.7, max_tokens=20))
    with pytest.raises(openai.BadRequestError) as err:
        sdk(session).chat.completions.create(model="m", messages=_conversation("a long task " * 20))
    assert err.value.code == "context_length_exceeded"
    trace = session.close()
    assert trace.context_exhausted and trace.error is None and trace.calls == 0


def test_backend_failure_is_502_and_recorded_as_infrastructure(gateway: Gateway, template: ChatTemplate) -> None:
    dead = InferenceClient(["http://127.0.0.1:9"], retry=RetryPolicy(max_retries=0, outage_wait_s=0.0),
                           request_timeout_s=5.0)
    session = gateway.open_session("dead", dead.session("dead"), template, SAMPLING)
    with pytest.raises(openai.APIStatusError) as err:
        sdk(session).chat.completions.create(model="m", messages=_conversation("x"))
    assert err.value.status_code == 502
    trace: SessionTrace = session.close()
    assert trace.error is not None and trace.error.startswith("backend:") and not trace.segments
    dead.close()


def test_stop_strings_cut_the_completion_at_a_token(gateway: Gateway, client: InferenceClient,
                                                    template: ChatTemplate, backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "stop")
    answer = sdk(session).chat.completions.create(model="m", messages=_conversation("x"), stop=["<tool_call>"])
    assert answer.choices[0].message.content == "Listing." and not answer.choices[0].message.tool_calls
    assert answer.choices[0].finish_reason == "stop"
    trace = session.close()
    (rec,) = backend.records()[before:]
    kept = [t for t, m in zip(trace.segments[0].token_ids, trace.segments[0].loss_mask, strict=True) if m]
    assert kept == rec["token_ids"][:len(kept)] and len(kept) < len(rec["token_ids"])
    assert "<tool_call>" in template.decode(kept) and "<tool_call>" not in template.decode(kept[:-1])
    assert trace.segments[0].token_ids[-1] == template.im_end  # appended, mask 0


def test_tool_choice_none_returns_the_call_as_text(gateway: Gateway, client: InferenceClient,
                                                   template: ChatTemplate) -> None:
    session = _open(gateway, client, template, "none")
    answer = sdk(session).chat.completions.create(model="m", messages=_conversation("x"), tools=TOOLS,
                                                  tool_choice="none")
    assert not answer.choices[0].message.tool_calls and "<tool_call>" in (answer.choices[0].message.content or "")
    session.close()


def test_socket_is_private_and_path_length_checked(gateway: Gateway, tmp_path: Path) -> None:
    assert gateway.socket_path.stat().st_mode & 0o777 == 0o600
    threads = threading.active_count()
    with Gateway(tmp_path / "gw.sock").start() as again:  # start() then __enter__: one server
        assert again.start() is again and threading.active_count() == threads + 1
    assert not (tmp_path / "gw.sock").exists()
    with pytest.raises(RuntimeError, match="serves once"):
        again.start()
    with pytest.raises(ValueError, match="longer than"):
        Gateway(tmp_path / ("x" * 120) / "gateway.sock")


def test_close_during_a_call_refuses_it_and_keeps_the_trace_final(gateway: Gateway, template: ChatTemplate,
                                                                  tmp_path: Path) -> None:
    slow = RecordingBackend(tmp_path / "slow.jsonl", template.encode("late<|im_end|>"), latency_s=1.0)
    client = InferenceClient([slow.url])
    session = _open(gateway, client, template, "in-flight")
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            sdk(session).chat.completions.create(model="m", messages=_conversation("x"))
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    deadline = time.monotonic() + 60
    while not session._call_lock.locked() and time.monotonic() < deadline:  # the call is inside the session
        time.sleep(0.01)
    trace = session.close()
    caller.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], openai.AuthenticationError)
    assert trace.calls == 0 and not trace.segments and trace.llm_s == 0 and trace.gateway_s == 0
    assert len(slow.records()) == 1  # the backend did answer; the closed session did not record it
    client.close()
    slow.close()


@pytest.mark.parametrize(("body", "status", "needle"), [
    (b"{not json", 400, "not JSON"),
    (b'{"messages": []}', 400, "messages must be a non-empty list"),
    (b'{"messages": [{"role": "function", "content": "x"}]}', 400, "messages[0].role"),
    (b'{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}', 400,
     "only text content parts"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": ["a", "b", "c", "d", "e"]}', 400, "stop must be"),
    (b'{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search"}]}', 400, "tools[0]"),
    (b'{"messages": [{"role": "user", "content": "' + b"x" * 40000 + b'"}]}', 413, "request body above"),
])
def test_malformed_requests_get_openai_errors(template: ChatTemplate, client: InferenceClient, tmp_path: Path,
                                              body: bytes, status: int, needle: str) -> None:
    with Gateway(tmp_path / "gw.sock", max_request_mb=0.03) as small:
        session = _open(small, client, template, "malformed")
        with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(small.socket_path))) as http:
            resp = http.post("http://gateway/v1/chat/completions", content=body,
                             headers={"Authorization": f"Bearer {session.key}", "Content-Type": "application/json"})
        assert resp.status_code == status and needle in resp.json()["error"]["message"], resp.text
        assert session.close().calls == 0
