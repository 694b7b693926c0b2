"""``POST /v1/responses`` through the real OpenAI SDK (``client.responses``) over the gateway's socket, a
recording stand-in backend behind it.

What is checked: a Responses call renders exactly the prompt the equivalent chat-completions call renders
(instructions, flat function tools, items); text and function-call answers, plain and streamed (the SDK's
strict stream accumulator included), agree; a harness that resends its items unchanged (function_call then
function_call_output) is one token-exact segment; unknown item, part and tool types, server-side state and
unreproducible sampling are a 400 naming the field; an ended session's key gets 401.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import httpx2
import openai
import pytest
from openai.types.responses import (
    EasyInputMessageParam,
    FunctionToolParam,
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseInputParam,
    ResponseTextDeltaEvent,
)

from rollout_node.agent.client import InferenceClient
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway import Gateway, GatewaySampling, GatewaySession
from tests.gateway.gw_helpers import TOOLS, RecordingBackend, assert_exact, sdk

SAMPLING = GatewaySampling(temperature=0.7, max_new_tokens=64, max_tokens=4096)
FLAT_TOOLS: list[FunctionToolParam] = [{"type": "function", "name": "bash", "description": "run a command", "strict": False,
               "parameters": TOOLS[0]["function"]["parameters"]}]
TEXT_REPLY = "Nothing to change.<|im_end|>"
CALL_REPLY = 'Listing.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'
STREAM_TEXT = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
               "response.output_text.delta", "response.output_text.done", "response.content_part.done",
               "response.output_item.done"]
STREAM_CALL = ["response.output_item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done"]


@pytest.fixture
def reply(backend: RecordingBackend, template: ChatTemplate) -> Iterator[Any]:
    """Set what the backend answers in this test (the module's backend is shared)."""
    yield lambda text: backend.reply(template.encode(text))
    backend.reply(template.encode(CALL_REPLY))


def _open(gateway: Gateway, client: InferenceClient, template: ChatTemplate, name: str) -> GatewaySession:
    return gateway.open_session(name, client.session(name), template, SAMPLING)


def _user(text: str) -> EasyInputMessageParam:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_text_answer_renders_the_chat_prompt(gateway: Gateway, client: InferenceClient, template: ChatTemplate,
                                             backend: RecordingBackend, reply: Any) -> None:
    reply(TEXT_REPLY)
    before = len(backend.records())
    chat = _open(gateway, client, template, "chat-twin")
    sdk(chat).chat.completions.create(model="m", tools=TOOLS, messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Fix calc.py"}])
    chat.close()
    session = _open(gateway, client, template, "responses-text")
    answer = sdk(session).responses.create(model="m", instructions="Be brief.", input=[_user("Fix calc.py")],
                                           tools=FLAT_TOOLS, store=False, temperature=0.7, max_output_tokens=200)
    trace = session.close()
    twin, rec = backend.records()[before:]
    assert rec["prompt"] == twin["prompt"], "the Responses call renders the chat-completions prompt"
    assert answer.status == "completed" and answer.output_text == "Nothing to change."
    (item,) = answer.output
    assert item.type == "message" and item.role == "assistant" and item.id.startswith("msg_")
    usage = answer.usage
    assert usage is not None
    assert usage.input_tokens == len(rec["prompt"]) and usage.output_tokens == len(rec["token_ids"])
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert trace.calls == 1 and len(trace.segments) == 1
    assert_exact(trace.segments[0], [rec])


def test_text_answer_streamed_in_the_sdks_event_order(gateway: Gateway, client: InferenceClient,
                                                      template: ChatTemplate, reply: Any) -> None:
    reply(TEXT_REPLY)
    session = _open(gateway, client, template, "responses-stream-text")
    api = sdk(session)
    events = list(api.responses.create(model="m", input="Fix calc.py", stream=True))
    assert [e.type for e in events] == [*STREAM_TEXT, "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    created, delta, completed = events[0], events[4], events[-1]
    assert isinstance(created, ResponseCreatedEvent) and isinstance(delta, ResponseTextDeltaEvent)
    assert isinstance(completed, ResponseCompletedEvent) and completed.response.usage is not None
    assert delta.delta == "Nothing to change." and completed.response.output_text == "Nothing to change."
    assert completed.response.usage.output_tokens > 0 and created.response.status == "in_progress"
    with api.responses.stream(model="m", input="Fix calc.py") as stream:  # the SDK's strict accumulator
        final = stream.get_final_response()
    assert final.output_text == "Nothing to change." and final.status == "completed"
    assert session.close().calls == 2


def _round_trip(api: openai.OpenAI, items: list[dict[str, Any]], turns: int, *, stream: bool) -> list[Any]:
    """A harness that resends its items unchanged: each answer's output items, then one
    ``function_call_output`` per call."""
    answers: list[Any] = []
    sent = cast(ResponseInputParam, items)  # JSON-shaped dicts, the same list
    for i in range(turns):
        answer: Response
        if stream:
            with api.responses.stream(model="m", input=sent, tools=FLAT_TOOLS, store=False) as events:
                answer = events.get_final_response()
        else:
            answer = api.responses.create(model="m", input=sent, tools=FLAT_TOOLS, store=False)
        answers.append(answer)
        items += [o.model_dump(exclude_none=True) for o in answer.output]
        items += [{"type": "function_call_output", "call_id": o.call_id, "output": f"out {i}\ncalc.py"}
                  for o in answer.output if o.type == "function_call"]
    return answers


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_round_trip_is_one_token_exact_segment(gateway: Gateway, client: InferenceClient,
                                                         template: ChatTemplate, backend: RecordingBackend,
                                                         stream: bool) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, f"responses-tools-{stream}")
    items: list[dict[str, Any]] = [{"role": "developer", "content": "You are a coding agent."}, dict(_user("Fix calc.py"))]
    answers = _round_trip(sdk(session), items, 3, stream=stream)
    message, call = answers[0].output
    assert message.type == "message" and answers[0].output_text == "Listing."
    assert call.type == "function_call" and call.name == "bash" and call.arguments == '{"command": "ls"}'
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    trace = session.close()
    records = backend.records()[before:]
    assert len(records) == 3 and trace.calls == 3
    assert len(trace.segments) == 1 and trace.reprefill_tokens == 0 and trace.error is None
    assert_exact(trace.segments[0], records)
    assert template.decode(records[-1]["prompt"]).count("out 1\ncalc.py") == 1  # the function_call_output


def test_raw_stream_has_event_lines_and_no_done(gateway: Gateway, client: InferenceClient,
                                                template: ChatTemplate) -> None:
    session = _open(gateway, client, template, "responses-raw")
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(session.socket_path))) as http:
        resp = http.post("http://gateway/v1/responses", headers={"Authorization": f"Bearer {session.key}"},
                         json={"model": "m", "input": "hi", "tools": FLAT_TOOLS, "stream": True})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    blocks = [b.split("\n") for b in resp.text.split("\n\n") if b]
    kinds = [b[0].removeprefix("event: ") for b in blocks]
    assert all(len(b) == 2 and b[1].startswith("data: ") for b in blocks) and "[DONE]" not in resp.text
    assert kinds == [*STREAM_TEXT, *STREAM_CALL, "response.completed"]
    session.close()


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input[0].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "bash"}]}, "input[0].arguments"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0]"),
    ({"input": "x", "tools": [{"type": "custom", "name": "apply_patch"}]}, "tools[0]"),
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "temperature": 0}, "temperature"),
    ({"input": "x", "temperature": 1.0}, "temperature"),
    ({"input": "x", "top_p": 0.9}, "top_p"),
    ({"input": "x", "text": {"format": {"type": "json_object"}}}, "text.format"),
    ({"input": "x", "tool_choice": {"type": "web_search"}}, "tool_choice"),
])
def test_what_the_gateway_cannot_serve_is_a_400_naming_the_field(
        gateway: Gateway, client: InferenceClient, template: ChatTemplate, backend: RecordingBackend,
        kwargs: dict[str, Any], param: str) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, f"responses-bad-{param}")
    with pytest.raises(openai.BadRequestError) as err:
        sdk(session).responses.create(model="m", **kwargs)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and param in body["message"]
    trace = session.close()
    assert trace.calls == 0 and not trace.segments and len(backend.records()) == before
    assert trace.refused is not None and trace.refused.startswith(f"HTTP 400 on {param}: ")


def test_an_ended_or_foreign_key_is_401(gateway: Gateway, client: InferenceClient, template: ChatTemplate) -> None:
    a, b = _open(gateway, client, template, "responses-key-a"), _open(gateway, client, template, "responses-key-b")
    sdk(a).responses.create(model="m", input="only for a")
    with pytest.raises(openai.AuthenticationError):
        sdk(b, key="sk-spoolrl-not-a-session").responses.create(model="m", input="x")
    trace_a = a.close()
    with pytest.raises(openai.AuthenticationError) as err:
        sdk(b, key=a.key).responses.create(model="m", input="a's key, after a ended")
    assert err.value.status_code == 401 and "session key" in str(err.value)
    sdk(b).responses.create(model="m", input="only for b")
    trace_b = b.close()
    assert trace_a.calls == 1 and trace_b.calls == 1
    assert "after a ended" not in template.decode(trace_b.segments[0].token_ids)


def test_a_capped_completion_is_incomplete(gateway: Gateway, client: InferenceClient, template: ChatTemplate,
                                           backend: RecordingBackend) -> None:
    before = len(backend.records())
    session = _open(gateway, client, template, "responses-capped")
    answer = sdk(session).responses.create(model="m", input="Fix calc.py", max_output_tokens=3)
    assert answer.incomplete_details is not None and answer.usage is not None
    assert answer.status == "incomplete" and answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage.output_tokens == 3 and not [o for o in answer.output if o.type == "function_call"]
    with httpx2.Client(transport=httpx2.HTTPTransport(uds=str(session.socket_path))) as http:
        resp = http.post("http://gateway/v1/responses", headers={"Authorization": f"Bearer {session.key}"},
                         json={"model": "m", "input": "Fix calc.py", "max_output_tokens": 3, "stream": True})
    assert resp.text.rstrip().split("\n\n")[-1].startswith("event: response.incomplete\n")
    trace = session.close()
    assert [len(r["token_ids"]) for r in backend.records()[before:]] == [3, 3] and trace.calls == 2
