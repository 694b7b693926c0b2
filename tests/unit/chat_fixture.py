"""A small byte-level BPE tokenizer with ChatML or Llama-3 special tokens, and episodes built on it by the
piece rule (content encoded with special tokens as plain text; generated tokens mask 1), for the decode
and report tests. No model, no network: the tokenizer is trained on a few lines in milliseconds."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from hpc.trajectory import Trajectory

CHATML = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
LLAMA3 = ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
SYSTEM = "You are a software engineer. Fix the bug, then submit."
TASK = "Set AGGREGATE in summary/config.py to `max`."
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "cat summary/config.py"}}\n</tool_call>'
OBSERVATION = 'AGGREGATE = "min"  # a file that says <|im_end|> and <tool_call> as text'
SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'


def tokenizer(specials: tuple[str, ...] = CHATML) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(specials),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([SYSTEM, TASK, CALL, OBSERVATION, SUBMIT] * 3, trainer=trainer)
    return tok


def write_model_dir(path: Path, specials: tuple[str, ...] = CHATML) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    tokenizer(specials).save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": specials[-1]}))
    return path


class Builder:
    """Appends messages by the piece rule of one chat format; ``ids``/``mask`` are the trajectory's arrays."""

    def __init__(self, tok: Tokenizer, fmt: str = "chatml") -> None:
        self.tok, self.fmt = tok, fmt
        self.content = Tokenizer.from_str(tok.to_str())
        self.content.encode_special_tokens = True
        self.ids: list[int] = []
        self.mask: list[int] = []
        if fmt == "llama3":
            self._add("<|begin_of_text|>", 0)

    def _add(self, text: str, trained: int, *, content: bool = False) -> None:
        enc = (self.content if content else self.tok).encode(text, add_special_tokens=False).ids
        self.ids += enc
        self.mask += [trained] * len(enc)

    def header(self, role: str) -> None:
        self._add(f"<|im_start|>{role}\n" if self.fmt == "chatml" else
                  f"<|start_header_id|>{role}<|end_header_id|>\n\n", 0)

    def end(self, trained: int = 0) -> None:
        self._add("<|im_end|>" if self.fmt == "chatml" else "<|eot_id|>", trained)
        if self.fmt == "chatml":
            self._add("\n", 0)

    def message(self, role: str, text: str) -> None:
        self.header(role)
        self._add(text, 0, content=True)
        self.end()

    def generated(self, text: str, *, stop: bool = True) -> None:
        self.header("assistant")
        self._add(text, 1)
        if stop:
            self.end(trained=1)


def episode(tok: Tokenizer, fmt: str = "chatml") -> Builder:
    """system, task, a generated call, an observation, a generated submit cut off before its end of turn."""
    b = Builder(tok, fmt)
    b.message("system", SYSTEM)
    b.message("user", TASK)
    b.generated(CALL)
    b.message("user", OBSERVATION)
    b.generated(SUBMIT, stop=False)
    return b


def trajectory(b: Builder, name: str, reward: float, **metrics: object) -> Trajectory:
    mask = np.asarray(b.mask, np.int8)
    return Trajectory(trajectory_id=f"{name}:s0:a0", task_id=name, group_id=f"{name}:g", sample_index=0,
                      token_ids=np.asarray(b.ids, np.int32), loss_mask=mask, logprobs=np.where(mask == 1, -0.5, 0.0),
                      policy_versions=np.where(mask == 1, 0, -1), reward=reward, logprob_kind="processed",
                      metrics={"stop_reason": "submit", "tests_passed": int(reward * 4), "tests_total": 4,
                               "diff_bytes": 120, "diff_applied": True, **metrics})
