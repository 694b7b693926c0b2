"""``spoolrl tiny-model``: deterministic, cached, HF format, a usable chat tokenizer, varied samples."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpc.errors import UsageError
from train_node.infer.tiny import MARKER, build_tiny_model

REPO = Path(__file__).resolve().parents[2]


def test_same_seed_same_bytes_other_seed_other_weights(models: dict[str, Path], tmp_path: Path) -> None:
    again = build_tiny_model(tmp_path / "again", seed=0, use_cache=False)  # a real rebuild, not a cache copy
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (models["a"] / name).read_bytes(), name
    assert (models["a"] / "model.safetensors").read_bytes() != (models["b"] / "model.safetensors").read_bytes()
    assert (models["a"] / "tokenizer.json").read_bytes() == (models["b"] / "tokenizer.json").read_bytes()


def test_cache_and_idempotent_output(models: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPOOLRL_CACHE", str(tmp_path / "cache"))
    first = build_tiny_model(tmp_path / "x", seed=0)
    cached = list((tmp_path / "cache" / "tiny-models").iterdir())
    assert len(cached) == 1 and (cached[0] / MARKER).exists()
    assert build_tiny_model(first, seed=0) == first  # same build in place: reused
    with pytest.raises(UsageError):
        build_tiny_model(first, seed=1)  # a different build never overwrites


def test_hf_format_tokenizer_and_chat_template(models: dict[str, Path]) -> None:
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(models["a"])
    assert cfg.model_type == "qwen2" and cfg.tie_word_embeddings is False and cfg.max_position_embeddings == 2048
    tok: Any = AutoTokenizer.from_pretrained(models["a"])
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|endoftext|>"
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    ids = tok.apply_chat_template([{"role": "user", "content": "def f(x):\n    return x"}],
                                  add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ids[0] == start and ids.count(end) == 1
    text = tok.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and "def f(x):\n    return x" in text
    assert tok.decode(tok.encode("naïve café ✓\n\tx", add_special_tokens=False)) == "naïve café ✓\n\tx"


def test_random_model_samples_varied_tokens(models: dict[str, Path]) -> None:
    """Untied + scaled lm_head: samples vary (a tied, scaled head just repeats the last token)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(models["a"], dtype=torch.float32).eval()
    torch.manual_seed(0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3, 4, 5]])).logits[0, -1]
        out = model.generate(torch.tensor([[1, 2, 3, 4, 5]]), do_sample=True, max_new_tokens=32, top_k=0,
                             pad_token_id=0, eos_token_id=None)
    assert 1.0 < float(logits.std()) < 3.0
    assert len(set(out[0, 5:].tolist())) > 20


def test_cli(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(tmp_path / "m"), "--seed", "3"],
                         cwd=REPO, capture_output=True, text=True, timeout=300, check=True)
    info = json.loads(out.stdout)
    assert info["seed"] == 3 and info["vocab_size"] == 4000 and 2e6 < info["params"] < 5e6
    assert (tmp_path / "m" / "model.safetensors").exists() and (tmp_path / "m" / "tokenizer.json").exists()


def test_warm_fit_takes_whole_sets_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``WarmSpec.group``: every mini-batch is made of whole consecutive sets of ``group`` examples."""
    from train_node.infer import warm

    base = build_tiny_model(tmp_path / "tiny", seed=0)
    # 6 sets of 4; each example's first ID names its set, the second its place in the set.
    examples = [([1 + s, 10 + j, 20, 21, 22], [0, 0, 1, 1, 1]) for s in range(6) for j in range(4)]
    batches: list[list[tuple[int, int]]] = []
    real_batch = warm._batch

    def recording(chosen: Any, pad: int) -> Any:
        batches.append([(ids[0], ids[1]) for ids, _ in chosen])
        return real_batch(chosen, pad)

    monkeypatch.setattr(warm, "_batch", recording)
    stats = warm.fit(base, tmp_path / "out", examples, warm.WarmSpec(steps=5, batch_size=8, group=4))
    assert stats["examples"] == 24 and len(batches) == 5
    for batch in batches:
        for i in range(0, 8, 4):
            assert [b[0] for b in batch[i:i + 4]] == [batch[i][0]] * 4 and [b[1] for b in batch[i:i + 4]] == [10, 11, 12, 13]
    assert len({b[i][0] for b in batches for i in (0, 4)}) > 1, "the sets are drawn at random"
    with pytest.raises(AssertionError, match="whole sets"):
        warm.fit(base, tmp_path / "bad", examples[:-1], warm.WarmSpec(steps=1, batch_size=8, group=4))
