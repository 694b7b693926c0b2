"""The per-message piece rule equals the model's own chat template (checked against transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hpc.errors import ConfigError
from rollout_node.agent import AgentLimits, AgentLoop, ChatTemplate, Message, format_tool_call
from tests.agent.agent_helpers import RecordingTools, ScriptedIds

MESSAGES = [Message("system", "You are a coding agent.\nUse the tools."), Message("user", "Fix the bug in calc.py")]


def _hf(model_dir: Path):  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def _apply(hf, messages: list[dict[str, str]], gen: bool) -> list[int]:  # type: ignore[no-untyped-def]
    return list(hf.apply_chat_template(messages, add_generation_prompt=gen, tokenize=True, return_dict=False))


def test_first_prompt_equals_apply_chat_template(tiny_model_dir: Path, template: ChatTemplate) -> None:
    hf = _hf(tiny_model_dir)
    msgs = [{"role": m.role, "content": m.content} for m in MESSAGES]
    assert template.first_prompt(MESSAGES) == _apply(hf, msgs, gen=True)
    without = _apply(hf, msgs, gen=False)
    assert tuple(_apply(hf, msgs, gen=True)[len(without):]) == template.generation_prompt
    assert template.suffix == (template.im_end, *template.encode("\n"))
    assert template.stop_token_ids[0] == template.im_end


def test_multi_turn_conversation_equals_template_rendering(tiny_model_dir: Path, template: ChatTemplate) -> None:
    """With canonically encoded assistant turns, the loop's IDs are exactly the template's rendering
    of the whole conversation: the pieces ARE the chat template, not an approximation of it."""
    texts = [format_tool_call("bash", {"command": "ls"}), "thinking", format_tool_call("submit", {})]
    policy = ScriptedIds(template, texts)
    loop = AgentLoop(template, AgentLimits(max_turns=5, observation_role="user"))
    result = loop.run(MESSAGES, policy, RecordingTools(output="calc.py\ntest_calc.py"))
    assert result.submitted
    convo = [{"role": m.role, "content": m.content} for m in MESSAGES]
    for turn in result.turns:
        convo.append({"role": "assistant", "content": template.decode(turn.completion.token_ids)})
        if turn.observation_tokens:
            convo.append({"role": "user", "content": turn.observation})
    rendered = _apply(_hf(tiny_model_dir), convo, gen=False)
    assert result.token_ids == rendered[:-1]  # the template's final "\n" follows only when another message does
    assert rendered[-1:] == list(template.after_end_of_turn)


# A Llama-3-family template written here from the format's description (BOS, a header per message,
# trimmed content, <|eot_id|>; the generation prompt is the assistant header).
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


@pytest.fixture(scope="module")
def llama3_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny BPE with Llama 3's special tokens and chat format (tokenizer files only)."""
    hf = _hf(tiny_model_dir)
    hf.add_special_tokens({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                           "additional_special_tokens": LLAMA3_SPECIALS[2:]})
    hf.chat_template = LLAMA3_TEMPLATE
    d = tmp_path_factory.mktemp("llama3")
    hf.save_pretrained(str(d))
    return d


def test_llama3_pieces_equal_its_template(llama3_dir: Path) -> None:
    """Header and end-of-turn pieces of the Llama 3 family: the first prompt (BOS included) and a whole
    multi-turn conversation equal the model's own apply_chat_template."""
    template = ChatTemplate.from_model_dir(llama3_dir)
    hf = _hf(llama3_dir)
    assert template.format.name == "llama3" and template.after_end_of_turn == ()
    msgs = [{"role": m.role, "content": m.content} for m in MESSAGES]
    assert template.first_prompt(MESSAGES) == _apply(hf, msgs, gen=True)
    assert template.first_prompt(MESSAGES)[0] == hf.convert_tokens_to_ids("<|begin_of_text|>")
    assert template.stop_token_ids[0] == hf.convert_tokens_to_ids("<|eot_id|>")
    texts = [format_tool_call("bash", {"command": "ls"}), "thinking", format_tool_call("submit", {})]
    loop = AgentLoop(template, AgentLimits(max_turns=5, observation_role="user"))
    result = loop.run(MESSAGES, ScriptedIds(template, texts), RecordingTools(output="calc.py\ntest_calc.py"))
    assert result.submitted
    convo = msgs[:]
    for turn in result.turns:
        convo.append({"role": "assistant", "content": template.decode(turn.completion.token_ids)})
        if turn.observation_tokens:
            convo.append({"role": "user", "content": turn.observation})
    assert result.token_ids == _apply(hf, convo, gen=False)


def test_unsupported_template_is_refused_naming_the_supported_ones(tiny_model_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "mistral_like"
    shutil.copytree(tiny_model_dir, d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    with pytest.raises(ConfigError, match=r"none of the formats spoolrl's agent supports \(chatml, llama3\)"):
        ChatTemplate.from_model_dir(d)


def test_missing_tokenizer_json_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(ConfigError, match="tokenizer.json"):
        ChatTemplate.from_model_dir(tmp_path)
