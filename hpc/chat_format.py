"""The chat formats spoolrl's agent has per-message pieces for, and how a model dir's template is matched.

Guarantees:
- One table (:data:`FORMATS`): for each family the role header, the end-of-turn token, what the
  template puts after it, and the special tokens that identify the family in a chat template.
  ``rollout_node.agent.template`` builds its token pieces from it; the CLI checks a model directory
  against it before anything is submitted (:func:`check_model_dir`), so an unsupported template is a
  ConfigError at ``validate``/``render``/``launch``/``demo``, not when a rollout node starts.
- Pure text (no tokenizer, no jinja); reading a model dir touches only ``tokenizer_config.json`` and
  ``chat_template.jinja``.

Supported: ``chatml`` (``<|im_start|>ROLE\\n ... <|im_end|>\\n``: Qwen 1.5-3, SmolLM2, InternLM2, QwQ)
and ``llama3`` (``<|start_header_id|>ROLE<|end_header_id|>\\n\\n ... <|eot_id|>``: Llama 3, 3.1, 3.2,
3.3). Qwen3's thinking template is ChatML; it strips the ``<think>`` part of EARLIER assistant turns
when it renders a conversation, which is not prefix-stable. spoolrl never re-renders: every turn's
prompt is the previous prompt plus the generated IDs, reasoning included, so the policy sees (and
is trained on) exactly what it generated; its prompts then differ from what the model's own
template would render for the same conversation after the first turn. Llama 3.1's template injects
a dated preamble into the system message; spoolrl's pieces do not, the system prompt is the one
the agent sends.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc.errors import ConfigError


@dataclass(frozen=True)
class ChatFormat:
    name: str
    role_header: str        # "{role}" is replaced by the role
    end_of_turn: str        # the special token that ends a message (the engine stops on it)
    after_end_of_turn: str  # what the template writes after it, before the next header
    markers: tuple[str, ...]  # special tokens whose presence identifies the family in a template

    def header(self, role: str) -> str:
        return self.role_header.replace("{role}", role)


CHATML = ChatFormat("chatml", "<|im_start|>{role}\n", "<|im_end|>", "\n", ("<|im_start|>", "<|im_end|>"))
LLAMA3 = ChatFormat("llama3", "<|start_header_id|>{role}<|end_header_id|>\n\n", "<|eot_id|>", "",
                    ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"))
FORMATS = (CHATML, LLAMA3)
SUPPORTED_FORMATS = tuple(f.name for f in FORMATS)


def detect_format(template_text: str) -> ChatFormat | None:
    """The family whose markers all occur in the template; a model with no template is ChatML."""
    if not template_text:
        return CHATML
    for fmt in FORMATS:
        if all(m in template_text for m in fmt.markers):
            return fmt
    return None


def read_chat_template(model_dir: Path) -> str:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` ('' if neither)."""
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    config_file = model_dir / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
    template = config.get("chat_template")
    return template if isinstance(template, str) else ""


def check_model_dir(model_dir: Path, key: str = "model.path") -> ChatFormat:
    """The model dir's chat format, or a ConfigError naming the key, what it found and what is supported."""
    if not model_dir.is_dir():
        raise ConfigError([f"{key}: {model_dir} is not a directory (an HF model dir with tokenizer.json; "
                           "'spoolrl model from-gguf' converts a GGUF file)"])
    text = read_chat_template(model_dir)
    fmt = detect_format(text)
    if fmt is None:
        raise ConfigError([f"{key}: the chat template of {model_dir} is none of the formats spoolrl's agent "
                           f"supports ({', '.join(SUPPORTED_FORMATS)}); its start: {json.dumps(text[:120])}. "
                           "Use a model with one of these templates (or add its pieces to hpc/chat_format.py)"])
    return fmt
