"""The embedded CPU engine: ONNX Runtime sessions over the graphs `trtspec build --backend onnx` wrote.

KV caches are pre-allocated per sequence as one [L, 2, S_max, 1, nkv, hd] array (past length first), so each
layer's past is bound as a contiguous prefix view (I/O binding kept across steps, see _Graph.run) and the new
keys / values of all layers are copied in after it at once: no per-step allocation of the cache. After a
verify step, `commit` compacts the accepted slots' rows in place. Plain decoding runs the context graph with
one token; speculative steps run the generation graph with exactly K + 1 slots, padding shorter drafts with
masked slots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from trtspec.engine.manifest import Manifest, read_manifest
from trtspec.errors import BuildError, RuntimeEngineError
from trtspec.runtime.engine import StepOutput


PAST_BLOCK = 64  # the past is bound in whole blocks of rows, so one I/O binding serves up to 64 steps
BINDINGS_KEPT = 8  # per graph: a few sequences decoding in turn each keep theirs


@dataclass
class _Cache:
    """One network's KV cache: a single array [L, 2, S_max, B, nkv, hd] (layer, key / value, position, ...),
    so a layer's past is a contiguous prefix view and a step's new rows land with one copy for all layers."""

    kv: np.ndarray
    length: int = 0

    @classmethod
    def allocate(cls, layers: int, size: int, kv_heads: int, head_dim: int, batch: int = 1) -> _Cache:
        return cls(np.zeros((layers, 2, size, batch, kv_heads, head_dim), np.float32))

    def compact(self, start: int, slots: tuple[int, ...]) -> None:
        """Move rows start + slots[i] to start + i (the fancy index copies the sources first)."""
        self.kv[:, :, start:start + len(slots)] = self.kv[:, :, start + np.asarray(slots)]


@dataclass
class _Sequence:
    base: _Cache
    draft: _Cache | None
    pending: int = 0  # slots written by the last verify, awaiting commit
    extra: dict = field(default_factory=dict)


@dataclass
class _Binding:
    """An I/O binding kept across steps: the past bound as a `bound`-row prefix of the cache, the new K/V and the
    plain outputs bound to arrays of their own; only the token inputs are rebound each step."""

    io: ort.IOBinding
    new_kv: np.ndarray  # [L, 2, T, B, nkv, hd]
    plain: dict[str, np.ndarray]


class _Graph:
    """One ONNX Runtime session, its I/O names and the bindings it keeps."""

    def __init__(self, path: Path, options: ort.SessionOptions):
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception types for bad files
            raise BuildError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]})") from None
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.plain = {o.name: o.shape[-1] for o in self.session.get_outputs() if not o.name.startswith("new_")}
        self.layers = sum(1 for o in self.outputs if o.startswith("new_key_"))
        self._bindings: dict[tuple, _Binding] = {}

    def run(self, feeds: dict[str, np.ndarray], cache: _Cache, tokens: int) -> dict[str, np.ndarray]:
        """Run over the cache's past and write the new K/V into it after that past (rows length .. + tokens).

        The past is bound rounded up to whole PAST_BLOCKs (at most the buffer): the rows past `length` are
        masked out (their weight is exactly 0, and they hold finite values: zeros or older K/V)."""
        p = cache.length
        bound = min(-(-p // PAST_BLOCK) * PAST_BLOCK, cache.kv.shape[2])
        binding = self._binding(cache, tokens, bound)
        mask = feeds["attention_mask"]  # [B, T, p + T] → [B, T, bound + T]
        wide = np.zeros((*mask.shape[:2], bound + tokens), bool)
        wide[..., :p], wide[..., bound:] = mask[..., :p], mask[..., p:]
        for name, value in {**feeds, "attention_mask": wide}.items():
            binding.io.bind_cpu_input(name, np.ascontiguousarray(value))
        self.session.run_with_iobinding(binding.io)
        cache.kv[:, :, p:p + tokens] = binding.new_kv
        return binding.plain

    def _binding(self, cache: _Cache, tokens: int, bound: int) -> _Binding:
        kv = cache.kv
        key = (kv.ctypes.data, kv.shape, tokens, bound)  # a buffer freed and reallocated alike binds alike
        if key in self._bindings:
            self._bindings[key] = self._bindings.pop(key)  # most recently used last
            return self._bindings[key]
        _, _, _, batch, heads, dim = kv.shape
        io = self.session.io_binding()
        plain = {name: np.empty((batch, tokens, width), np.float32) for name, width in self.plain.items()}
        for name, out in plain.items():
            io.bind_output(name, "cpu", 0, np.float32, list(out.shape), out.ctypes.data)
        new_kv = np.empty((self.layers, 2, tokens, batch, heads, dim), np.float32)
        for l in range(self.layers):
            for i, kind in enumerate(("key", "value")):
                io.bind_input(f"past_{kind}_{l}", "cpu", 0, np.float32, [bound, batch, heads, dim],
                              kv[l, i].ctypes.data)
                io.bind_output(f"new_{kind}_{l}", "cpu", 0, np.float32, [tokens, batch, heads, dim],
                               new_kv[l, i].ctypes.data)
        if len(self._bindings) >= BINDINGS_KEPT:
            self._bindings.pop(next(iter(self._bindings)))
        self._bindings[key] = _Binding(io, new_kv, plain)
        return self._bindings[key]


class OrtEngine:
    """The Engine interface over ONNX Runtime, one sequence per call."""

    def __init__(self, engine_dir: str | Path, *, threads: int | None = None):
        from trtspec.model.onnx_graph import session_options

        self.engine_dir = Path(engine_dir)
        self.manifest: Manifest = read_manifest(self.engine_dir)
        options = session_options(threads)
        files = self.manifest.files
        graph = lambda role: _Graph(self.engine_dir / files[role], options) if role in files else None  # noqa: E731
        self._context, self._generation = graph("context"), graph("generation")
        self._draft_context, self._draft_generation = graph("draft_context"), graph("draft_generation")
        self._medusa = graph("medusa")
        m, p = self.manifest.model, self.manifest.profile
        self.vocab_size, self.max_draft_len = m.vocab_size, p.max_draft_len
        self.num_medusa_heads = m.num_medusa_heads
        self.has_eagle_draft = self._draft_context is not None
        self._slots = p.tokens_per_step
        self._size = p.max_seq_len + self._slots  # room for one padded step past max_seq_len
        self._seqs: dict[int, _Sequence] = {}
        self._ids = itertools.count()
        self._staging: dict[int, _Cache] = {}  # batch size → [S_max, B, nkv, hd] per layer, reused every step

    def open(self) -> int:
        m = self.manifest.model
        base = _Cache.allocate(m.num_layers, self._size, m.num_kv_heads, m.head_dim)
        draft = (_Cache.allocate(m.draft_layers, self._size, m.draft_num_kv_heads, m.draft_head_dim)
                 if self.has_eagle_draft else None)
        seq = next(self._ids)
        self._seqs[seq] = _Sequence(base, draft)
        return seq

    def close(self, seq: int) -> None:
        self._seqs.pop(seq, None)

    def prefill(self, seq: int, token_ids: np.ndarray) -> StepOutput:
        t = len(token_ids)
        if not 1 <= t <= self.manifest.profile.max_input_len:
            raise RuntimeEngineError(f"prompt of {t} tokens; the engine takes 1..{self.manifest.profile.max_input_len} "
                                     "(max_input_len in the manifest)")
        cache = self._seqs[seq].base
        out = self._context.run(_feeds(token_ids, np.arange(t), np.tril(np.ones((t, t), bool))), cache, t)
        cache.length += t
        return _step(out, t)

    def verify(self, seq: int, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray) -> StepOutput:
        state = self._seqs[seq]
        cache, n = state.base, len(tokens)
        self._check_room(cache, n)
        if n == 1:  # speculation off: one token through the context graph, no padding
            out = self._context.run(_feeds(tokens, cache.length + np.asarray(depths), np.ones((1, 1), bool),
                                           past=cache.length), cache, 1)
        else:
            ids, pos, full = _pad(tokens, cache.length + np.asarray(depths), mask, self._slots)
            out = self._generation.run(_feeds(ids, pos, full, past=cache.length), cache, self._slots)
        state.pending = n
        return _step(out, n)

    def verify_batch(self, items: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> list[StepOutput]:
        """One generation-graph run over several sequences' drafts (seq, tokens, depths, mask) in one batch.

        The sequences' caches are gathered into a staging batch [P_max, B, nkv, hd] (shorter pasts are
        masked), the new K/V are scattered back after the run; commit then works per sequence as usual."""
        states = [self._seqs[seq] for seq, *_ in items]
        for state, (_, tokens, _, _) in zip(states, items):
            self._check_room(state.base, len(tokens))
        plain = all(len(tokens) == 1 for _, tokens, _, _ in items)
        slots = 1 if plain else self._slots
        lengths = [state.base.length for state in states]
        feeds = _batch_feeds(items, lengths, slots)
        staging = self._staging_cache(len(items))
        staging.length = max(lengths)
        for b, state in enumerate(states):  # gather the pasts
            staging.kv[:, :, :lengths[b], b] = state.base.kv[:, :, :lengths[b], 0]
        out = (self._context if plain else self._generation).run(feeds, staging, slots)
        p = staging.length
        for b, state in enumerate(states):  # scatter the new rows after each sequence's own past
            state.base.kv[:, :, lengths[b]:lengths[b] + slots, 0] = staging.kv[:, :, p:p + slots, b]
            state.pending = len(items[b][1])
        return [StepOutput(out["logits"][b, :len(t)].copy(), out["hidden"][b, :len(t)].copy())
                for b, (_, t, _, _) in enumerate(items)]

    def _staging_cache(self, batch: int) -> _Cache:
        if batch not in self._staging:
            m = self.manifest.model
            self._staging[batch] = _Cache.allocate(m.num_layers, self._size, m.num_kv_heads, m.head_dim, batch)
        return self._staging[batch]

    def commit(self, seq: int, slots: tuple[int, ...]) -> None:
        state = self._seqs[seq]
        assert slots[0] == 0 and state.pending >= len(slots), (slots, state.pending)
        if slots != tuple(range(len(slots))):
            state.base.compact(state.base.length, slots)
        state.base.length += len(slots)
        state.pending = 0

    def medusa_logits(self, hidden: np.ndarray) -> np.ndarray:
        (logits,) = self._medusa.session.run(None, {"hidden": np.asarray(hidden, np.float32)[None]})
        return logits[:, 0]  # [heads, V]

    def draft_extend(self, seq: int, token_ids: np.ndarray, features: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        t = len(token_ids)
        self._check_room(cache, t)
        feeds = _feeds(token_ids, cache.length + np.arange(t), np.tril(np.ones((t, t), bool)), past=cache.length)
        feeds["features"] = np.asarray(features, np.float32)[None]
        out = self._draft_context.run(feeds, cache, t)
        cache.length += t
        return _step(out, t)

    def draft_step(self, seq: int, token_ids: np.ndarray, features: np.ndarray, depths: np.ndarray,
                   mask: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        m = len(token_ids)
        self._check_room(cache, self._slots)
        ids, pos, full = _pad(token_ids, cache.length + np.asarray(depths) - 1, mask, self._slots)
        feeds = _feeds(ids, pos, full, past=cache.length)
        feats = np.zeros((1, self._slots, features.shape[-1]), np.float32)
        feats[0, :m] = features
        feeds["features"] = feats
        return _step(self._draft_generation.run(feeds, cache, self._slots), m)  # scratch rows, not committed

    def _check_room(self, cache: _Cache, tokens: int) -> None:
        """The committed length must stay below max_seq_len; a step's slots may use the buffer's spare K + 1."""
        if cache.length >= self.manifest.profile.max_seq_len or cache.length + tokens > self._size:
            raise RuntimeEngineError(f"sequence of {cache.length} tokens cannot take {tokens} more: "
                                     f"max_seq_len is {self.manifest.profile.max_seq_len}")


def _feeds(ids, positions, mask: np.ndarray, past: int = 0) -> dict[str, np.ndarray]:
    """Graph inputs for one sequence; `mask` covers the new tokens, the whole past is visible."""
    t = mask.shape[0]
    full = np.ones((1, t, past + t), bool)  # [1, T, P+T]
    full[0, :, past:] = mask
    return {"input_ids": np.asarray(ids, np.int64)[None], "position_ids": np.asarray(positions, np.int64)[None],
            "attention_mask": full}


def _batch_feeds(items, lengths: list[int], slots: int) -> dict[str, np.ndarray]:
    """Graph inputs for a batch: row b sees its own past (lengths[b] columns) and its padded draft."""
    batch, past = len(items), max(lengths)
    ids, pos = np.zeros((batch, slots), np.int64), np.zeros((batch, slots), np.int64)
    mask = np.zeros((batch, slots, past + slots), bool)  # [B, T, P_max + T]
    for b, (_, tokens, depths, tree_mask) in enumerate(items):
        ids[b], pos[b], mask[b, :, past:] = _pad(tokens, lengths[b] + np.asarray(depths), tree_mask, slots)
        mask[b, :, :lengths[b]] = True
    return {"input_ids": ids, "position_ids": pos, "attention_mask": mask}


def _pad(tokens, positions, mask: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad n slots to the static `slots`: padded slots see only themselves and nobody sees them."""
    n = len(tokens)
    ids, pos = np.zeros(slots, np.int64), np.full(slots, positions[0], np.int64)
    ids[:n], pos[:n] = tokens, positions
    full = np.eye(slots, dtype=bool)
    full[:n, :n] = mask
    return ids, pos, full


def _step(out: dict[str, np.ndarray], n: int) -> StepOutput:
    """The first n slots' outputs, copied: the bound output arrays are overwritten by the graph's next run."""
    return StepOutput(out["logits"][0, :n].copy(), out["hidden"][0, :n].copy())
