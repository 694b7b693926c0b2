"""The gateway's rendering against the models' own chat templates (transformers' apply_chat_template),
and prefix merging with the Llama 3 format."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from rollout_node.agent.client import InferenceClient
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway import Gateway, GatewaySampling, Renderer, split_tool_calls
from rollout_node.gateway.render import assistant_key
from tests.gateway.gw_helpers import TOOLS, RecordingBackend, as_history, assert_exact, sdk
from train_node.infer.tiny import cached_tiny_model

# Qwen 2.5's tool-calling template, written here from its published text (tools block in the system
# message, <tool_call> blocks in assistant turns, consecutive tool results in one user turn).
NL = "{{ '\\n' }}"  # a newline transformers' trim_blocks cannot eat
QWEN_TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system" + NL + "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    + NL + NL + "{% endif %}# Tools" + NL + NL + "You may call one or more functions to assist with the user query."
    + NL + NL + "You are provided with function signatures within <tools></tools> XML tags:" + NL + "<tools>"
    "{% for tool in tools %}" + NL + "{{ tool | tojson }}{% endfor %}" + NL + "</tools>" + NL + NL
    + "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:" + NL + "<tool_call>" + NL
    + '{"name": <function-name>, "arguments": <args-json-object>}' + NL + "</tool_call><|im_end|>" + NL
    + "{% elif messages[0]['role'] == 'system' %}<|im_start|>system" + NL + "{{ messages[0]['content'] }}<|im_end|>"
    + NL + "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'user' or (m['role'] == 'system' and not loop.first) %}"
    "<|im_start|>{{ m['role'] }}" + NL + "{{ m['content'] }}<|im_end|>" + NL
    + "{% elif m['role'] == 'assistant' %}<|im_start|>assistant"
    "{% if m['content'] %}" + NL + "{{ m['content'] }}{% endif %}"
    "{% for tc in m['tool_calls'] or [] %}" + NL + "<tool_call>" + NL + "{\"name\": \"{{ tc['function']['name'] }}\", "
    "\"arguments\": {{ tc['function']['arguments'] | tojson }}}" + NL + "</tool_call>{% endfor %}<|im_end|>" + NL
    + "{% elif m['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}<|im_start|>user{% endif %}"
    + NL + "<tool_response>" + NL + "{{ m['content'] }}" + NL + "</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}<|im_end|>" + NL + "{% endif %}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant" + NL + "{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
LLAMA3_SPECIALS = ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def _hf(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _conversation(arguments_as_text: bool) -> list[dict[str, Any]]:
    args: Any = {"command": "ls -la"}
    return [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Fix calc.py"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "bash", "arguments": json.dumps(args) if arguments_as_text else args}},
            {"id": "c2", "type": "function",
             "function": {"name": "bash", "arguments": '{"command": "cat calc.py"}' if arguments_as_text
                          else {"command": "cat calc.py"}}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "calc.py"},
        {"role": "tool", "tool_call_id": "c2", "content": "def add(a, b): return a - b"},
        {"role": "assistant", "content": "Found it."},
        {"role": "user", "content": "Go on."},
    ]


@pytest.mark.parametrize("system", [True, False])
def test_chatml_tools_rendering_equals_qwen_template(template: ChatTemplate, system: bool) -> None:
    hf = _hf(cached_tiny_model())
    hf_messages = _conversation(arguments_as_text=False)[0 if system else 1:]
    expected = hf.apply_chat_template(hf_messages, tools=TOOLS, chat_template=QWEN_TOOLS_TEMPLATE,
                                      add_generation_prompt=True, tokenize=True, return_dict=False)
    openai_messages = _conversation(arguments_as_text=True)[0 if system else 1:]
    assert Renderer(template).prompt(openai_messages, TOOLS, {}) == list(expected)
    no_tools = hf.apply_chat_template(hf_messages, chat_template=QWEN_TOOLS_TEMPLATE, add_generation_prompt=True,
                                      tokenize=True, return_dict=False)
    assert Renderer(template).prompt(openai_messages, (), {}) == list(no_tools)


def test_split_tool_calls_keeps_bad_blocks_as_text() -> None:
    content, calls = split_tool_calls('a <tool_call>\n{"name": "x", "arguments": {"k": 1}}\n</tool_call> b '
                                      '<tool_call>{not json}</tool_call> <tool_call>{"name": "y"}</tool_call>')
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("x", {"k": 1}), ("y", {})]
    assert content == "a  b <tool_call>{not json}</tool_call>"
    assert len({c.id for c in calls}) == 2 and all(c.id.startswith("call_") for c in calls)


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BPE with Llama 3's special tokens and chat format (tokenizer files only)."""
    hf = _hf(cached_tiny_model())
    hf.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                           "additional_special_tokens": LLAMA3_SPECIALS})
    hf.chat_template = LLAMA3_TEMPLATE
    d = tmp_path_factory.mktemp("llama3")
    hf.save_pretrained(str(d))
    return d


@pytest.fixture(scope="module")
def llama3(llama3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ChatTemplate, Gateway,
                                                                                          RecordingBackend]]:
    t = ChatTemplate.from_model_dir(llama3_dir)
    reply = t.encode('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|eot_id|>')
    backend = RecordingBackend(tmp_path_factory.mktemp("l3") / "record.jsonl", reply)
    gw = Gateway(tmp_path_factory.mktemp("l3gw") / "gw.sock").start()
    yield t, gw, backend
    gw.close()
    backend.close()


def test_llama3_rendering_equals_its_template(llama3: tuple[ChatTemplate, Gateway, RecordingBackend],
                                              llama3_dir: Path) -> None:
    t = llama3[0]
    assert t.format.name == "llama3"
    messages = [m for m in _conversation(True) if m["role"] in ("system", "user")]
    expected = _hf(llama3_dir).apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                   return_dict=False)
    assert Renderer(t).prompt(messages, (), {}) == list(expected)


def test_llama3_unchanged_history_is_one_segment(llama3: tuple[ChatTemplate, Gateway, RecordingBackend]) -> None:
    t, gw, backend = llama3
    client = InferenceClient([backend.url])
    session = gw.open_session("l3", client.session("l3"), t, GatewaySampling(temperature=0.7, max_tokens=4096))
    api = sdk(session)
    messages: list[ChatCompletionMessageParam] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "go"}]
    for i in range(2):
        answer = api.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        (call,) = answer.choices[0].message.tool_calls or []
        messages += [as_history(answer.choices[0].message),
                     {"role": "tool", "tool_call_id": call.id, "content": f"out {i}"}]
    trace = session.close()
    client.close()
    records = backend.records()
    assert len(trace.segments) == 1 and records[0]["prompt"][0] == t.bos_prefix[0]
    assert_exact(trace.segments[0], records)
    assert "<|start_header_id|>ipython<|end_header_id|>" in t.decode(records[1]["prompt"], skip_special_tokens=False)


def test_repeated_answers_render_with_their_own_ids_in_order(template: ChatTemplate) -> None:
    """Two answers with the same text and call (different IDs, e.g. another tokenization) keep their
    own IDs by position; call ids do not matter (a harness may renumber them)."""
    call = [{"id": "renumbered", "type": "function", "function": {"name": "bash", "arguments": '{"command":"ls"}'}}]
    key = assistant_key("Again.", [("x", "bash", {"command": "ls"})])
    first, second = (11, 12, template.im_end), (13, template.im_end)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "Again.", "tool_calls": call},
                {"role": "tool", "content": "a"}, {"role": "assistant", "content": " Again. ", "tool_calls": call},
                {"role": "tool", "content": "b"}, {"role": "assistant", "content": "Again.", "tool_calls": call}]
    ids = Renderer(template).prompt(messages, (), {key: [first, second]})
    head = [*template.prefix("assistant")]
    starts = [i for i in range(len(ids)) if ids[i:i + len(head)] == head]
    assert ids[starts[0] + len(head):][:3] == list(first) and ids[starts[1] + len(head):][:2] == list(second)
    third = ids[starts[2] + len(head):]  # a third occurrence was never produced: rendered from its text
    assert template.decode(third).startswith("Again.\n<tool_call>")
