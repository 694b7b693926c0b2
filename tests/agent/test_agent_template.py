"""The per-message piece rule equals the model's own chat template (checked against transformers)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from agent_helpers import RecordingTools, ScriptedIds

from hpc.errors import ConfigError
from rollout_node.agent import AgentLimits, AgentLoop, ChatTemplate, Message, format_tool_call

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


def test_non_chatml_template_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    d = tmp_path / "llama_like"
    shutil.copytree(tiny_model_dir, d)
    (d / "chat_template.jinja").write_text("{% for m in messages %}[INST] {{ m['content'] }} [/INST]{% endfor %}")
    with pytest.raises(ConfigError, match="not ChatML"):
        ChatTemplate.from_model_dir(d)


def test_missing_tokenizer_json_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    with pytest.raises(ConfigError, match="tokenizer.json"):
        ChatTemplate.from_model_dir(tmp_path)
