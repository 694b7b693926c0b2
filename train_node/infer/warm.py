"""Warm start: a short supervised fit of a tiny model on token-ID transcripts, cached like the tiny model.

Guarantees:
- The loss is next-token cross-entropy on the positions whose ``loss_mask`` is 1 (the policy's own
  tokens); prompts and observations are context only. Nothing here knows the transcripts' format:
  callers build them (``rollout_node.tasks.builtin.warm`` builds the demo's with the agent's own pieces).
- Deterministic for the same base model, transcripts and :class:`WarmSpec` (seeded shuffling, one
  thread count); the output directory is an HF model dir (safetensors + the base's tokenizer files).
- Cached under ``$SPOOLRL_CACHE/warm-models/<key>``, the key hashing the base model's files, every
  transcript ID and the spec; published atomically (built aside, then renamed).
- :func:`value_probabilities` (:func:`choice_probabilities` for a model in memory), :func:`rows_by_answer`
  and :class:`Sampler` read a model for the caller's measurements.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc.fsutil import tmp_name
from train_node.infer.tiny import cache_root

MARKER = "spoolrl_warm_start.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
Example = tuple[Sequence[int], Sequence[int]]  # (token_ids, loss_mask)


@dataclasses.dataclass(frozen=True)
class WarmSpec:
    """The fit: AdamW steps over shuffled mini-batches.

    ``group``: the examples come in consecutive sets of this many that a batch takes whole (a set is
    one statement with every value, so each batch's value targets are exactly uniform per statement).
    """

    steps: int = 60
    batch_size: int = 8
    lr: float = 2e-3
    seed: int = 0
    threads: int = 2
    group: int = 1
    trainable_layers: int = 0  # as trainer.trainable_layers: only the top N blocks, the norm and the head (0: all)


def _spec_key(spec: WarmSpec) -> dict[str, Any]:
    """The spec as hashed: ``trainable_layers`` only when set, so the keys made before it existed still hold."""
    fields = dataclasses.asdict(spec)
    if not spec.trainable_layers:
        del fields["trainable_layers"]
    return fields


def warm_key(base_dir: Path, examples: Sequence[Example], spec: WarmSpec) -> str:
    h = hashlib.sha256(json.dumps(_spec_key(spec), sort_keys=True).encode())
    for f in sorted(p for p in Path(base_dir).iterdir() if p.is_file()):
        h.update(f.name.encode() + f.read_bytes())
    for ids, mask in examples:
        h.update(json.dumps([list(ids), list(mask)]).encode())
    return h.hexdigest()[:16]


def cached_warm_start(base_dir: str | Path, examples: Sequence[Example], spec: WarmSpec = WarmSpec()) -> Path:
    """The warm-started copy of ``base_dir`` (fitted on a cache miss); returns its directory."""
    base = Path(base_dir)
    target = cache_root() / "warm-models" / warm_key(base, examples, spec)
    if (target / MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_name(target)
    shutil.rmtree(tmp, ignore_errors=True)
    stats = fit(base, tmp, examples, spec)
    (tmp / MARKER).write_text(json.dumps({"spec": dataclasses.asdict(spec), "base": str(base), **stats},
                                         indent=1, sort_keys=True) + "\n")
    try:
        os.replace(tmp, target)
    except OSError:  # another process published it first
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _batch(examples: Sequence[Example], pad: int) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(ids) for ids, _ in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.bool)
    attn = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (tok, m) in enumerate(examples):
        ids[row, : len(tok)] = torch.tensor(list(tok))
        mask[row, : len(m)] = torch.tensor(list(m), dtype=torch.bool)
        attn[row, : len(tok)] = 1
    return ids, mask, attn


def _load(model_dir: str | Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no weight-loading bars in the demo's output
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def fit(base_dir: Path, out_dir: Path, examples: Sequence[Example], spec: WarmSpec) -> dict[str, Any]:
    """Fit ``base_dir``'s model on ``examples`` and save it (with the base's tokenizer) into ``out_dir``."""
    import torch

    from train_node.trainer.layers import train_top_layers

    assert examples, "a warm start needs transcripts"
    assert spec.batch_size % spec.group == 0 and len(examples) % spec.group == 0, "whole sets per batch"
    torch.set_num_threads(spec.threads)
    t0 = time.monotonic()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = _load(base_dir)
        model.train()
        train_top_layers(model, spec.trainable_layers)
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=spec.lr, weight_decay=0.0)
        gen = torch.Generator().manual_seed(spec.seed)
        losses = []
        for step in range(spec.steps):
            sets = torch.randint(len(examples) // spec.group, (spec.batch_size // spec.group,), generator=gen)
            pick = [int(k) * spec.group + j for k in sets for j in range(spec.group)]
            ids, mask, attn = _batch([examples[i] for i in pick], pad=0)
            # lm_head only where the loss is taken: the policy's tokens are ~15 % of an episode
            hidden = model.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, :-1]
            keep = mask[:, 1:]
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden[keep]), ids[:, 1:][keep])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            lr_scale = min(1.0, (step + 1) / 10) * (1 - step / spec.steps)  # short warm-up, linear decay
            for group in opt.param_groups:
                group["lr"] = spec.lr * lr_scale
            opt.step()
            losses.append(float(loss.detach()))
    model.eval()
    out_dir.mkdir(parents=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (base_dir / name).is_file():
            shutil.copy2(base_dir / name, out_dir / name)
    tail = losses[-10:]
    return {"fit_s": round(time.monotonic() - t0, 1), "loss_first": losses[0], "loss_last": sum(tail) / len(tail),
            "examples": len(examples)}


def value_probabilities(model_dir: str | Path, prefixes: Sequence[Sequence[int]], choices: Sequence[int],
                        temperature: float = 1.0) -> list[list[float]]:
    """For each prefix: the sampling probability (at ``temperature``) of each choice token as the next token."""
    return choice_probabilities(_load(model_dir).eval(), prefixes, choices, temperature)


def choice_probabilities(model: Any, prefixes: Sequence[Sequence[int]], choices: Sequence[int],
                         temperature: float = 1.0) -> list[list[float]]:
    """:func:`value_probabilities` of a model already in memory (one being trained, say)."""
    import torch

    out = []
    with torch.no_grad():
        for prefix in prefixes:
            logits = model(input_ids=torch.tensor([list(prefix)])).logits[0, -1].float()
            probs = torch.softmax(logits / temperature, dim=-1)
            out.append([float(probs[c]) for c in choices])
    return out


def rows_by_answer(probs: Sequence[Sequence[float]], answers: Sequence[int]) -> list[list[float]]:
    """Row ``a``: the mean of ``probs`` over the prefixes whose answer is choice ``a`` (P(each choice | asked a)).

    Identical rows mean the model ignores what the prompt asks for; the diagonal's mean, weighted by how
    often each answer is asked, is the expected reward."""
    k = len(probs[0])
    rows = []
    for a in range(k):
        mine = [p for p, ans in zip(probs, answers, strict=True) if ans == a]
        rows.append([sum(p[i] for p in mine) / len(mine) if mine else 0.0 for i in range(k)])
    return rows


def format_rows(rows: Sequence[Sequence[float]]) -> str:
    """``[0.25,0.25,...] [...]``: :func:`rows_by_answer` on one line."""
    return " ".join("[" + ",".join(f"{x:.2f}" for x in row) + "]" for row in rows)


class Sampler:
    """Plain sampling from a model dir in this process (KV cache, one sequence): for measurements only."""

    def __init__(self, model_dir: str | Path, seed: int = 0) -> None:
        import torch

        self.model = _load(model_dir).eval()
        self.gen = torch.Generator().manual_seed(seed)

    def generate(self, prompt: Sequence[int], max_tokens: int, temperature: float,
                 stop_ids: Sequence[int]) -> tuple[list[int], list[float]]:
        """Sampled IDs (the stop token included when hit) and their logprobs at ``temperature``."""
        import torch

        ids, logps, past = list(prompt), [], None
        out: list[int] = []
        with torch.no_grad():
            step_in = torch.tensor([ids])
            for _ in range(max_tokens):
                res = self.model(input_ids=step_in, past_key_values=past, use_cache=True)
                past = res.past_key_values
                logp = torch.log_softmax(res.logits[0, -1].float() / temperature, dim=-1)
                tok = int(torch.multinomial(logp.exp(), 1, generator=self.gen))
                out.append(tok)
                logps.append(float(logp[tok]))
                if tok in stop_ids:
                    break
                step_in = torch.tensor([[tok]])
        return out, logps
