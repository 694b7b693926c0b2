"""Per-message chat pieces as token IDs, derived once from a model dir without torch/transformers.

Guarantees:
- Loads ``tokenizer.json`` with the Rust ``tokenizers`` library and reads the special tokens from
  ``tokenizer_config.json``; no jinja, no transformers.
- The chat template must be one of :data:`hpc.chat_format.FORMATS`: ChatML
  (``<|im_start|>ROLE\\nCONTENT<|im_end|>\\n``, generation prompt ``<|im_start|>assistant\\n``) or
  Llama 3 (``<|start_header_id|>ROLE<|end_header_id|>\\n\\nCONTENT<|eot_id|>``). Anything else is a
  ConfigError naming the supported formats.
- **The piece rule.** A message is ``prefix(role) + encode_content(content) + suffix`` where
  ``prefix(role) = encode(header(role))`` (e.g. ``"<|im_start|>" + role + "\\n"``) and
  ``suffix = encode(end_of_turn + after_end_of_turn)`` (``"<|im_end|>\\n"``; ``"<|eot_id|>"``),
  each encoded ALONE (special tokens become their single IDs). Pieces are computed once and
  cached. For a first prompt whose message contents neither start nor end with whitespace this
  equals ``apply_chat_template(..., tokenize=True)`` (tested); where content starts with
  whitespace, the BPE of the whole rendered text could merge across the boundary and ours does
  not. That is deliberate: what matters is that the trainer sees exactly the IDs the engine saw,
  and those are ours.
- Message CONTENT is encoded with special tokens treated as plain text (:meth:`ChatTemplate.encode_content`):
  a tool output or a file that contains ``<|im_end|>`` or ``<|im_start|>`` cannot forge turn
  boundaries; only the pieces above produce special IDs.
- ``im_end`` is the end-of-turn ID (``<|im_end|>``, ``<|eot_id|>``; the name is ChatML's);
  ``after_end_of_turn`` is what the template puts after it (``"\\n"`` for ChatML, nothing for
  Llama 3); a completion that stops without it gets ``suffix`` appended.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from hpc.chat_format import CHATML, ChatFormat, check_model_dir, read_chat_template
from hpc.errors import ConfigError

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"


@dataclass(frozen=True)
class Message:
    """One chat message (text only; tool calls live inside the assistant's text)."""

    role: str
    content: str


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json stores a special token as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        return str(value.get("content")) if value.get("content") is not None else None
    return value if isinstance(value, str) else None


class ChatTemplate:
    """Chat pieces (one :class:`hpc.chat_format.ChatFormat`) as token IDs plus the tokenizer the agent uses."""

    def __init__(self, tokenizer: Tokenizer, *, eos_token: str | None = None, bos_token: str | None = None,
                 template_text: str = "", chat_format: ChatFormat = CHATML) -> None:
        self.tokenizer = tokenizer
        self.format = chat_format
        # A second instance with encode_special_tokens on (the flag lives on the object; toggling it
        # per call would race between episode threads).
        self._content_tokenizer = Tokenizer.from_str(tokenizer.to_str())
        self._content_tokenizer.encode_special_tokens = True
        self._prefixes: dict[str, tuple[int, ...]] = {}
        self.im_end = self._special_id(chat_format.end_of_turn)
        self.eos = tokenizer.token_to_id(eos_token) if eos_token else None
        # A template that opens with the BOS token (Llama 3; rare for ChatML) gets it at the start of a prompt.
        bos_id = tokenizer.token_to_id(bos_token) if bos_token and "bos_token" in template_text else None
        self.bos_prefix: tuple[int, ...] = (int(bos_id),) if bos_id is not None else ()
        self.suffix = tuple(self.encode(chat_format.end_of_turn + chat_format.after_end_of_turn))
        assert self.suffix[0] == self.im_end, "the end-of-turn token must encode to its own ID"
        self.after_end_of_turn = self.suffix[1:]
        self.generation_prompt = self.prefix("assistant")
        self.im_start = self.generation_prompt[0]  # the ID that opens a role header (ChatML's name)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> ChatTemplate:
        """Load ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``chat_template.jinja``) of an HF model dir."""
        d = Path(model_dir)
        tok_file = d / "tokenizer.json"
        if not tok_file.is_file():
            raise ConfigError([f"model dir {d}: no tokenizer.json (the agent needs a fast tokenizer file)"])
        config_file = d / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_file.read_text()) if config_file.is_file() else {}
        chat_format = check_model_dir(d, key=f"model dir {d}")
        template_text = read_chat_template(d)
        return cls(Tokenizer.from_file(str(tok_file)), eos_token=_token_text(config.get("eos_token")),
                   bos_token=_token_text(config.get("bos_token")), template_text=template_text,
                   chat_format=chat_format)

    def _special_id(self, text: str) -> int:
        tid = self.tokenizer.token_to_id(text)
        if tid is None:
            raise ConfigError([f"tokenizer has no {text} token, which the {self.format.name} chat format needs"])
        return int(tid)

    def encode(self, text: str) -> list[int]:
        """Encode a piece of text alone (no post-processor additions; special tokens recognised)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_content(self, text: str) -> list[int]:
        """Encode message content alone; special-token text inside it stays text (no forged turns)."""
        return list(self._content_tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def prefix(self, role: str) -> tuple[int, ...]:
        """The role header (``<|im_start|>ROLE\\n``) as IDs (cached: a handful of roles per template)."""
        cached = self._prefixes.get(role)
        if cached is None:
            if not re.fullmatch(r"[A-Za-z_]+", role):
                raise ValueError(f"bad chat role {role!r}")
            cached = self._prefixes[role] = tuple(self.encode(self.format.header(role)))
        return cached

    @property
    def stop_token_ids(self) -> list[int]:
        """What the engine must stop on: the end of turn, and EOS when it differs."""
        return [self.im_end] + ([self.eos] if self.eos is not None and self.eos != self.im_end else [])

    def message_ids(self, role: str, content_ids: Sequence[int]) -> list[int]:
        return [*self.prefix(role), *content_ids, *self.suffix]

    def first_prompt(self, messages: Sequence[Message]) -> list[int]:
        """The opening prompt: every message by the piece rule, then the generation prompt."""
        ids: list[int] = list(self.bos_prefix)
        for m in messages:
            ids.extend(self.message_ids(m.role, self.encode_content(m.content)))
        ids.extend(self.generation_prompt)
        return ids
