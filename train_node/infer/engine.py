"""The lightweight CPU engine: a transformers causal LM behind a continuous-batching scheduler.

Guarantees:
- One scheduler thread owns the model. Every decode step runs all active sequences in ONE
  forward pass (left-padded KV cache); new sequences join between steps, finished ones leave.
- Logprobs are PROCESSED (vLLM's ``processed_logprobs``): the log-probability of the sampled token
  under the distribution it was drawn from (``min_tokens`` bans, ``logits / T``, top-k, top-p,
  renormalised), so the trainer can score exactly the same quantity.
- Weights change only between decode steps. A staged model is swapped in before the next token
  is sampled, and the KV cache of every running sequence is recomputed with the new weights, so
  each generated token comes entirely from the weights of the version its span names (a stale
  cache would mix versions, vLLM's prefix-cache pitfall). A model is staged only after it loaded
  completely; a failed load leaves the serving model untouched.
- With a ``seed``, a sequence samples from its own torch.Generator, so results do not depend on
  what else is in the batch (up to fp rounding of batched matmuls, ~1e-6 in fp32).
- Prefix cache (``prefix_cache_mb`` > 0): the KV of a finished sequence is kept, and a new prompt
  that starts with the same tokens (an agent's next turn re-sends the whole conversation; the
  samples of a group share their prompt) forwards only the tokens after the longest common prefix;
  the prompts that join in one step forward theirs in one pass (padded inside as well as on the left).
  Bounded in bytes, least recently used out first; emptied when new weights serve, so a reused KV
  always comes from the weights that serve (the same pitfall as above).
"""

from __future__ import annotations

import collections
import dataclasses
import inspect
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hpc.config.inference import CPU_MAX_BATCH, CPU_PREFIX_CACHE_MB
from train_node.infer.protocol import ChoiceResult, SamplingParams

if TYPE_CHECKING:
    from transformers import PretrainedConfig

KV = list[tuple[torch.Tensor, torch.Tensor]]


@dataclasses.dataclass
class LoadedModel:
    """A fully loaded model and the policy version it represents."""

    model: Any
    version: int
    path: str
    eos_ids: frozenset[int]


def load_model(path: str | Path, version: int, dtype: str = "float32") -> LoadedModel:
    """Load an HF checkpoint dir completely (raises on any problem; nothing is swapped then)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per reload would swamp the server log
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    model.eval()
    eos = model.config.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
    return LoadedModel(model=model, version=version, path=str(path), eos_ids=eos_ids)


class Sequence:
    """One choice being generated; ``done`` is set when it finished (or failed: ``error``)."""

    def __init__(self, prompt: tuple[int, ...], params: SamplingParams) -> None:
        self.prompt = prompt
        self.params = params
        self.generator: torch.Generator | None = None
        if params.seed is not None:
            self.generator = torch.Generator().manual_seed(params.seed)
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[dict[int, float]] = []
        self.spans: list[list[int]] = []
        self.finish_reason: str | None = None
        self.stop_reason: int | None = None
        self.error: str | None = None
        self.cancelled = False  # set by a caller that gave up; the engine drops the row at its next step
        self.done = threading.Event()

    def result(self) -> ChoiceResult:
        assert self.finish_reason is not None
        return ChoiceResult(self.prompt, self.token_ids, self.logprobs, self.top, self.spans,
                            self.finish_reason, self.stop_reason)

    def append(self, token: int, logprob: float, top: dict[int, float], version: int) -> None:
        i = len(self.token_ids)
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.top.append(top)
        if self.spans and self.spans[-1][0] == version:
            self.spans[-1][2] = i + 1
        else:
            self.spans.append([version, i, i + 1])


# --- KV cache plumbing (the only code that knows transformers' cache layout) -------------------

def _kv_of(cache: Any) -> KV:
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def _cache_from(kv: KV, config: PretrainedConfig) -> Any:
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config)
    except TypeError:
        cache = DynamicCache()
    for i, (k, v) in enumerate(kv):
        cache.update(k, v, i)
    return cache


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    if width == 0:
        return t
    shape = list(t.shape)
    shape[dim] = width
    return torch.cat([t.new_zeros(shape), t], dim=dim)


def _kv_bytes(kv: KV) -> int:
    return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)


class PrefixCache:
    """The KV of finished sequences by their tokens (see the module docstring). Scheduler thread only.

    Found by the chained hashes of their full blocks of ``block`` tokens (as vLLM's prefix cache): a
    lookup hashes the prompt's blocks, takes the entry that holds the deepest of those block prefixes,
    then measures the exact common prefix with that entry's tokens (a hash collision costs a hit, never
    a wrong KV). The cost is one hash per block, whatever the number of entries."""

    def __init__(self, max_bytes: int, block: int = 16) -> None:
        self.max_bytes = max_bytes
        self.block = block  # also the shortest prefix worth reusing: a batch-of-one forward costs something
        self._entries: collections.OrderedDict[int, tuple[torch.Tensor, KV, int, list[int]]] = \
            collections.OrderedDict()
        self._index: dict[int, int] = {}  # chained block hash -> the newest entry holding that block prefix
        self._next = 0
        self.bytes = 0
        self.hits = 0
        self.reused_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def enabled(self) -> bool:
        """False with a budget of 0 (``inference.cpu_prefix_cache_mb: 0``): nothing is looked up or kept."""
        return self.max_bytes > 0

    def stats(self) -> dict[str, int]:
        """What the cache holds and has served (``/health``)."""
        return {"entries": len(self), "bytes": self.bytes, "max_bytes": self.max_bytes, "hits": self.hits,
                "reused_tokens": self.reused_tokens}

    def clear(self) -> None:
        self._entries.clear()
        self._index.clear()
        self.bytes = 0

    def _hashes(self, tokens: list[int] | tuple[int, ...]) -> list[int]:
        out, h = [], 0
        for start in range(0, len(tokens) - self.block + 1, self.block):
            h = hash((h, tuple(tokens[start:start + self.block])))
            out.append(h)
        return out

    def _drop(self, key: int) -> None:
        _, _, size, hashes = self._entries.pop(key)
        self.bytes -= size
        for h in hashes:
            if self._index.get(h) == key:
                del self._index[h]

    def put(self, tokens: list[int], kv: KV) -> None:
        """Keep ``kv`` (one row, ``len(tokens)`` positions; copied by the caller) for ``tokens``."""
        size = _kv_bytes(kv)
        if len(tokens) < self.block or size > self.max_bytes:
            return
        new, hashes = torch.tensor(tokens), self._hashes(tokens)
        for key in {self._index[h] for h in hashes if h in self._index}:  # entries the new one extends
            old = self._entries[key][0]
            if len(old) <= len(new) and torch.equal(old, new[:len(old)]):
                self._drop(key)
        while self._entries and self.bytes + size > self.max_bytes:
            self._drop(next(iter(self._entries)))  # the least recently used
        key, self._next = self._next, self._next + 1
        self._entries[key] = (new, kv, size, hashes)
        self._index.update(dict.fromkeys(hashes, key))
        self.bytes += size

    def longest(self, prompt: tuple[int, ...]) -> tuple[int, KV] | None:
        """The longest cached common prefix of ``prompt`` (at most all but its last token, which must be
        forwarded for the next token's logits) and its KV, or None if under one block."""
        # the deepest block any entry holds (a chained hash names the whole prefix up to its block, so the
        # blocks before it need no pointer of their own: an evicted entry may have held theirs)
        key = next((self._index[h] for h in reversed(self._hashes(prompt[:-1])) if h in self._index), None)
        if key is None:
            return None
        tokens, kv, _, _ = self._entries[key]
        m = min(len(tokens), len(prompt) - 1)
        differ = (tokens[:m] != torch.tensor(prompt[:m])).nonzero()
        n = int(differ[0]) if len(differ) else m
        if n < self.block:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        self.reused_tokens += n
        return n, [(k[:, :, :n], v[:, :, :n]) for k, v in kv]


class _Batch:
    """The running sequences: a left-padded KV cache, its mask, next positions, last logits."""

    def __init__(self) -> None:
        self.rows: list[Sequence] = []
        self.kv: Any = None  # a transformers Cache
        self.mask = torch.zeros(0, 0, dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)
        self.logits = torch.zeros(0, 0)

    def clear(self) -> None:
        self.__init__()  # type: ignore[misc]

    def merge(self, other: _Batch, config: PretrainedConfig) -> None:
        """Append ``other``'s rows, left-padding whichever cache is shorter."""
        if not self.rows:
            self.rows, self.kv, self.mask = other.rows, other.kv, other.mask
            self.next_pos, self.logits = other.next_pos, other.logits
            return
        la, lb = self.mask.shape[1], other.mask.shape[1]
        length = max(la, lb)
        kv = [(torch.cat([_left_pad(ka, length - la, 2), _left_pad(kb, length - lb, 2)]),
               torch.cat([_left_pad(va, length - la, 2), _left_pad(vb, length - lb, 2)]))
              for (ka, va), (kb, vb) in zip(_kv_of(self.kv), _kv_of(other.kv), strict=True)]
        self.kv = _cache_from(kv, config)
        self.mask = torch.cat([_left_pad(self.mask, length - la, 1), _left_pad(other.mask, length - lb, 1)])
        self.rows = self.rows + other.rows
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self.logits = torch.cat([self.logits, other.logits])

    def keep(self, keep: list[int], config: PretrainedConfig) -> None:
        """Keep only rows ``keep`` and drop the left columns that are padding in every row."""
        if not keep:
            self.clear()
            return
        idx = torch.tensor(keep)
        mask = self.mask[idx]
        real_cols = mask.any(dim=0).nonzero()
        cut = int(real_cols[0]) if len(real_cols) else 0
        self.kv = _cache_from([(k[idx, :, cut:], v[idx, :, cut:]) for k, v in _kv_of(self.kv)], config)
        self.mask = mask[:, cut:]
        self.rows = [self.rows[i] for i in keep]
        self.next_pos = self.next_pos[idx]
        self.logits = self.logits[idx]


class Engine:
    """Continuous batching over one model. Thread-safe entry points: submit, swap, close."""

    def __init__(self, loaded: LoadedModel, *, max_batch: int = CPU_MAX_BATCH, max_model_len: int | None = None,
                 prefix_cache_mb: int = CPU_PREFIX_CACHE_MB) -> None:
        self._loaded = loaded
        self._max_batch = max_batch
        self.prefix = PrefixCache(prefix_cache_mb << 20)
        self.prefilled_tokens = 0  # prompt tokens forwarded at admission (those the prefix cache did not serve)
        cfg_len = getattr(loaded.model.config, "max_position_embeddings", None) or 2048
        self.max_model_len = min(max_model_len or cfg_len, cfg_len)
        self._cache_kw = "cache" if "cache" in inspect.signature(loaded.model.forward).parameters \
            else "past_key_values"
        self._pending: queue.Queue[Sequence] = queue.Queue()
        self._staged: tuple[LoadedModel, threading.Event] | None = None
        self._wake = threading.Condition()
        self._batch = _Batch()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="spoolrl-engine", daemon=True)
        self._thread.start()

    def counters(self) -> dict[str, Any]:
        """The prompt tokens forwarded so far (those the prefix cache did not serve) and the cache's
        :meth:`PrefixCache.stats`: what ``/health`` reports, so a client can see what its prompts cost."""
        return {"prompt_tokens_forwarded": self.prefilled_tokens, "prefix_cache": self.prefix.stats()}

    @property
    def version(self) -> int:
        return self._loaded.version

    @property
    def path(self) -> str:
        return self._loaded.path

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue sequences; each one's ``done`` event fires when it finished or failed."""
        for seq in seqs:
            self._pending.put(seq)
        with self._wake:
            self._wake.notify()

    def stage(self, loaded: LoadedModel) -> threading.Event:
        """Stage a fully loaded model; the returned event fires once it serves (non-blocking)."""
        applied = threading.Event()
        with self._wake:
            self._staged = (loaded, applied)
            self._wake.notify()
        return applied

    def swap(self, loaded: LoadedModel, timeout_s: float | None = None) -> bool:
        """Stage a fully loaded model; returns once it serves (True), or False on timeout, in which case
        it was withdrawn and never serves (the version reported stays the one that serves)."""
        applied = self.stage(loaded)
        if applied.wait(timeout_s) or not self._withdraw(applied):
            applied.wait()  # taken by the scheduler meanwhile: it serves once the event fires
            return True
        return False

    def _withdraw(self, applied: threading.Event) -> bool:
        """Unstage the model behind ``applied`` if the scheduler has not taken it yet."""
        with self._wake:
            if self._staged is not None and self._staged[1] is applied:
                self._staged = None
                return True
        return False

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(timeout=10)

    # --- the scheduler thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not (self._closed or self._staged or self._batch.rows or not self._pending.empty()):
                    self._wake.wait()
                if self._closed:
                    break
            try:
                self._step()
            except Exception as exc:  # never let one bad batch kill the server
                self._fail_all(f"engine error: {type(exc).__name__}: {exc}")
        self._fail_all("server shutting down")

    @torch.inference_mode()
    def _step(self) -> None:
        self._apply_staged()
        self._admit()
        if not self._batch.rows:
            return
        finished = self._sample()
        if finished:
            self._remember(finished)
            for i in finished:  # answered once the prefix cache holds it: the next turn finds it there
                self._batch.rows[i].done.set()
            keep = [i for i in range(len(self._batch.rows)) if i not in finished]
            self._batch.keep(keep, self._loaded.model.config)
        if self._batch.rows:
            self._decode()

    def _apply_staged(self) -> None:
        with self._wake:
            staged, self._staged = self._staged, None
        if staged is None:
            return
        self._loaded = staged[0]
        self.prefix.clear()  # computed by the old weights
        rows, self._batch = self._batch.rows, _Batch()
        try:
            if rows:  # recompute every running sequence's KV with the new weights
                self._batch.merge(self._prefill(rows), self._loaded.model.config)
        except Exception:
            self._batch.rows = rows  # so that _fail_all reports them
            raise
        finally:
            staged[1].set()  # the new weights serve either way

    def _admit(self) -> None:
        new: list[Sequence] = []
        while len(self._batch.rows) + len(new) < self._max_batch:
            try:
                new.append(self._pending.get_nowait())
            except queue.Empty:
                break
        if not new:
            return
        config = self._loaded.model.config
        misses, hits = [], []
        for seq in new:
            cached = self.prefix.longest(seq.prompt) if self.prefix.enabled else None
            if cached is None:
                misses.append(seq)
            else:
                hits.append((seq, *cached))
        if hits:
            self._batch.merge(self._prefill_after(hits), config)
        if misses:
            self._batch.merge(self._prefill(misses), config)

    def _remember(self, finished: set[int]) -> None:
        """Keep the KV of the rows that finished normally in the prefix cache (a copy, by the index: the
        batch's cache is rebuilt as rows come and go)."""
        if not self.prefix.enabled:
            return
        b = self._batch
        kv = _kv_of(b.kv)
        for i in sorted(finished):
            row = b.rows[i]
            if row.finish_reason not in ("stop", "length"):
                continue
            n = int(b.next_pos[i])  # forwarded so far: every token but the last one sampled
            tokens = (list(row.prompt) + row.token_ids)[:n]
            cols = b.mask[i].nonzero().squeeze(1)  # its n columns: padding may sit left of them and between
            self.prefix.put(tokens, [(k[i:i + 1, :, cols], v[i:i + 1, :, cols]) for k, v in kv])

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self._loaded.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                                 logits_to_keep=1, **{self._cache_kw: cache})
        return out.logits[:, -1].float()

    def _prefill(self, rows: list[Sequence]) -> _Batch:
        """Forward prompt + generated-so-far of ``rows`` (left-padded) into a fresh batch."""
        seqs = [list(r.prompt) + r.token_ids for r in rows]
        self.prefilled_tokens += sum(len(s) for s in seqs)
        width = max(len(s) for s in seqs)
        ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        return self._new_batch(rows, ids, mask, pos, _cache_from([], self._loaded.model.config))

    def _prefill_after(self, hits: list[tuple[Sequence, int, KV]]) -> _Batch:
        """Forward each row's prompt after its first ``n`` tokens, whose KV the prefix cache had, all rows in
        one forward. Row ``i`` is [left pad | its ``n_i`` cached tokens | inner pad | its ``m_i`` new tokens],
        so that every row's last prompt token is in the last column (the only one whose logits are kept);
        pad columns are masked out (as the left padding of :meth:`_prefill`) and their K/V zeroed."""
        cached = max(n for _, n, _ in hits)
        new = max(len(row.prompt) - n for row, n, _ in hits)
        ids, mask, pos, layers = [], [], [], []
        for row, n, kv in hits:
            m = len(row.prompt) - n
            self.prefilled_tokens += m
            ids.append([0] * (new - m) + list(row.prompt[n:]))
            mask.append([0] * (cached - n) + [1] * n + [0] * (new - m) + [1] * m)
            pos.append([n] * (new - m) + list(range(n, n + m)))
            layers.append([(_left_pad(k, cached - n, 2), _left_pad(v, cached - n, 2)) for k, v in kv])
        cache = _cache_from([(torch.cat([r[i][0] for r in layers]), torch.cat([r[i][1] for r in layers]))
                             for i in range(len(layers[0]))], self._loaded.model.config)
        return self._new_batch([row for row, _, _ in hits], torch.tensor(ids), torch.tensor(mask), torch.tensor(pos),
                               cache)

    def _new_batch(self, rows: list[Sequence], ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                   cache: Any) -> _Batch:
        """Forward ``ids`` after ``cache`` into a batch of ``rows``. The pad columns' K/V (mask 0) are zeroed so
        that later merges never carry garbage (they stay masked out); each row's next position is its count of
        real columns."""
        batch = _Batch()
        batch.logits = self._forward(ids, mask, pos, cache)
        pad = (mask == 0)[:, None, :, None]
        batch.kv = _cache_from([(k.masked_fill(pad, 0), v.masked_fill(pad, 0)) for k, v in _kv_of(cache)],
                               self._loaded.model.config)
        batch.rows, batch.mask, batch.next_pos = rows, mask, mask.sum(1)
        return batch

    def _decode(self) -> None:
        b = self._batch
        ids = torch.tensor([[r.token_ids[-1]] for r in b.rows])
        b.mask = torch.cat([b.mask, torch.ones(len(b.rows), 1, dtype=b.mask.dtype)], dim=1)
        b.logits = self._forward(ids, b.mask, b.next_pos[:, None], b.kv)
        b.next_pos = b.next_pos + 1

    def _sample(self) -> set[int]:
        """Sample one token for every row; returns the indices of rows that finished (the caller sets their
        ``done``).

        Logprobs (the sampled token's and the top-k alternatives) come from the row's *processed*
        distribution, the one the token was drawn from (vLLM's ``processed_logprobs``)."""
        b = self._batch
        finished = set()
        for i, row in enumerate(b.rows):
            logp = processed_logprobs(b.logits[i], row.params, len(row.token_ids), self._loaded.eos_ids)
            token = _draw(logp, row)
            kr = row.params.logprobs or 0
            top_vals, top_ids = logp.topk(kr) if kr else (logp[:0], logp[:0])
            # tokens outside a top-k / top-p set have logprob -inf: not alternatives (and not valid JSON)
            top = {t: v for t, v in zip(top_ids.tolist(), top_vals.tolist(), strict=True) if v > float("-inf")}
            chosen = float(logp[token])
            top[token] = chosen
            row.append(token, chosen, top, self._loaded.version)
            if self._finish(row, token):
                finished.add(i)
        return finished

    def _finish(self, row: Sequence, token: int) -> bool:
        n = len(row.token_ids)
        if row.cancelled:
            row.finish_reason = "abort"
        elif n >= row.params.min_tokens and token in row.params.stop_token_ids:
            row.finish_reason, row.stop_reason = "stop", token
        elif n >= row.params.min_tokens and not row.params.ignore_eos and token in self._loaded.eos_ids:
            row.finish_reason = "stop"
        elif n >= row.params.max_tokens or len(row.prompt) + n >= self.max_model_len:
            row.finish_reason = "length"
        return row.finish_reason is not None

    def _fail_all(self, message: str) -> None:
        rows, self._batch = self._batch.rows, _Batch()
        while True:
            try:
                rows.append(self._pending.get_nowait())
            except queue.Empty:
                break
        for row in rows:
            row.error = message
            row.done.set()


def processed_logprobs(logits: torch.Tensor, p: SamplingParams, generated: int,
                       eos_ids: frozenset[int]) -> torch.Tensor:
    """log of the distribution a token is drawn from, over the whole vocabulary (fp32, -inf outside).

    In vLLM's order: banned stop tokens (``min_tokens``), then ``logits / T``, then top-k, then top-p,
    renormalised. At ``T == 0`` (greedy) it is ``log_softmax(logits)``: a greedy pick has no sampling
    distribution to report, so such samples cannot be trained (the config and the trainer refuse T = 0).
    """
    logits = logits.float()
    if generated < p.min_tokens:  # vLLM's min_tokens: stop tokens are not allowed yet
        logits = logits.clone()
        banned = list(set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_ids)))
        logits[banned] = float("-inf")
    if p.temperature == 0.0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / p.temperature
    if 0 < p.top_k < scaled.shape[-1]:
        kth = scaled.topk(p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    logp = torch.log_softmax(scaled, dim=-1)
    if p.top_p < 1.0:
        sorted_logp, order = logp.sort(descending=True)
        probs = sorted_logp.exp()
        outside = probs.cumsum(0) - probs > p.top_p  # keep the smallest set reaching top_p
        kept = sorted_logp.masked_fill(outside, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(0, order, kept - torch.logsumexp(kept, dim=0))
    return logp


def _draw(logp: torch.Tensor, row: Sequence) -> int:
    """The sampler: greedy at T = 0, else one draw from the processed distribution."""
    if row.params.temperature == 0.0:
        return int(logp.argmax())
    return int(torch.multinomial(logp.exp(), 1, generator=row.generator))
