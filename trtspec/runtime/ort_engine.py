"""The embedded CPU engine: ONNX Runtime sessions over the graphs `trtspec build --backend onnx` wrote.

KV caches are pre-allocated rows of one pool [L, 2, rows, nkv, S_max, hd], bound to the graphs as past and present
(I/O binding kept across steps), so a step's new rows land in the cache in place: no copy, no per-step allocation;
`commit` compacts a verify step's accepted slots in place, and the rows stay dense as sequences close, so a batched
step binds the open sequences' rows directly. The context graph runs prompts; every decode step runs the generation
graph over the smallest of the engine's slot profiles that holds its draft (padding with masked slots), so a step
pays only for the draft it carries. EAGLE draft caches live in a second pool with the same rows. The whole layout
and its reasons: docs/design.md.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from trtspec import native
from trtspec.engine.manifest import MATMUL_BLOCK, Manifest, check_decoded_on_cpu, read_manifest
from trtspec.errors import BuildError, ConfigError, RuntimeEngineError
from trtspec.speculative.engine import StepOutput
from trtspec.model.ort_session import effective_spin, session_options

log = logging.getLogger(__name__)

# per graph: a few sequences decoding in turn, a few prompt lengths, each slot profile and batch size keep theirs
BINDINGS_KEPT = 24


@dataclass
class _Cache:
    """One network's KV cache: a single array [L, 2, B, nkv, S_max, hd] (layer, key / value, batch row, ...), so
    each layer's key or value is one contiguous buffer, GroupQueryAttention's past and present at once."""

    kv: np.ndarray
    length: int = 0
    address: int = field(init=False, repr=False)  # kv's data pointer: bindings are keyed by it

    def __post_init__(self):
        self.address = self.kv.ctypes.data

    @classmethod
    def allocate(cls, layers: int, size: int, kv_heads: int, head_dim: int, batch: int = 1) -> _Cache:
        return cls(np.zeros((layers, 2, batch, kv_heads, size, head_dim), np.float32))

    def rows(self, first: int, count: int) -> _Cache:
        """Rows first..first+count-1 as a cache of their own (a view: each layer's key / value stays contiguous)."""
        return _Cache(self.kv[:, :, first:first + count])

    def compact(self, start: int, slots: tuple[int, ...]) -> None:
        """Move rows start + slots[i] to start + i (the fancy index copies the sources first)."""
        self.kv[..., start:start + len(slots), :] = self.kv[..., start + np.asarray(slots), :]


@dataclass
class _Sequence:
    base: _Cache
    draft: _Cache | None
    pending: int = 0  # slots written by the last verify, awaiting commit
    row: int | None = None  # its row of the engine's pool, or None: a cache of its own
    extra: dict = field(default_factory=dict)


@dataclass
class _Binding:
    """An I/O binding kept across steps: every input bound to an array of its own that a step overwrites in place,
    the outputs to arrays of their own, past_* and present_* both to the cache's buffers."""

    io: ort.IOBinding
    inputs: dict[str, np.ndarray]
    plain: dict[str, np.ndarray]


class _Graph:
    """One ONNX Runtime session, its I/O names and the bindings it keeps."""

    def __init__(self, path: Path, options: ort.SessionOptions):
        try:
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as e:  # ORT raises its own exception types for bad files
            raise BuildError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0]})") from None
        # plain outputs: name → (rows, width); rows an int when fixed (a context graph's logits: the last position
        # only), else None (one per fed token)
        self.plain = {o.name: (o.shape[1] if isinstance(o.shape[1], int) else None, o.shape[-1])
                      for o in self.session.get_outputs() if not o.name.startswith("present_")}
        self.layers = sum(1 for o in self.session.get_outputs() if o.name.startswith("present_key_"))
        self._bindings: dict[tuple, _Binding] = {}

    def run(self, feeds: dict[str, np.ndarray], cache: _Cache) -> dict[str, np.ndarray]:
        """Run over the cache (each row's past is feeds["past_lengths"] long); the new K/V rows are written into it
        after that past. Returns the plain outputs, bound arrays that the next run overwrites."""
        binding = self._binding(cache, feeds)
        for name, value in feeds.items():
            binding.inputs[name][...] = value
        self.session.run_with_iobinding(binding.io)
        return binding.plain

    def run_plain(self, ids: np.ndarray, lengths: np.ndarray, cache: _Cache, slots: int) -> dict[str, np.ndarray]:
        """A plain step: token ids[b, 0] after row b's past (lengths[b] rows), padded to `slots` slots that see only
        themselves (the generation graph; `run` would feed the same). Its binding is its own, so the padding and the
        tree mask are written once: a decode step writes three small inputs, nothing else in Python (each numpy
        call after a run costs far more than in a loop: the run has evicted the interpreter from the caches)."""
        key = (cache.address, cache.kv.shape, slots, "plain")
        binding = self._bindings.get(key)
        if binding is None:
            batch = len(ids)
            feeds = {"input_ids": np.zeros((batch, slots), np.int64), "past_lengths": np.zeros(batch, np.int32),
                     "position_ids": np.zeros((batch, slots), np.int64),
                     "tree_mask": np.broadcast_to(np.eye(slots, dtype=bool), (batch, slots, slots)).copy()}
            binding = self._binding(cache, feeds, key)
            for name, value in feeds.items():
                binding.inputs[name][...] = value
        inputs = binding.inputs
        inputs["input_ids"][:, :1] = ids
        inputs["past_lengths"][:] = lengths
        # every slot at the row's next position (padding is masked)
        inputs["position_ids"][:] = inputs["past_lengths"][:, None]
        self.session.run_with_iobinding(binding.io)
        return binding.plain

    def _binding(self, cache: _Cache, feeds: dict[str, np.ndarray], key: tuple | None = None) -> _Binding:
        kv = cache.kv
        batch, tokens = feeds["input_ids"].shape
        key = key or (cache.address, kv.shape, tokens)  # a buffer freed and reallocated alike binds alike
        if key in self._bindings:
            self._bindings[key] = self._bindings.pop(key)  # most recently used last
            return self._bindings[key]
        io = self.session.io_binding()
        inputs = {name: np.empty(np.shape(value), np.asarray(value).dtype) for name, value in feeds.items()}
        plain = {name: np.empty((batch, rows or tokens, width), np.float32)
                 for name, (rows, width) in self.plain.items()}
        for name, array in inputs.items():
            io.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        for name, array in plain.items():
            io.bind_output(name, "cpu", 0, np.float32, list(array.shape), array.ctypes.data)
        for l in range(self.layers):
            for i, kind in enumerate(("key", "value")):
                buffer = kv[l, i]  # [B, nkv, S_max, hd]: GroupQueryAttention sees past is present, writes in place
                io.bind_input(f"past_{kind}_{l}", "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
                io.bind_output(f"present_{kind}_{l}", "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
        if len(self._bindings) >= BINDINGS_KEPT:
            self._bindings.pop(next(iter(self._bindings)))
        self._bindings[key] = _Binding(io, inputs, plain)
        return self._bindings[key]


class OrtEngine:
    """The Engine interface over ONNX Runtime, one sequence per call."""

    def __init__(self, engine_dir: str | Path, *, threads: int | None = None, spin: bool | None = None,
                 drafter: bool = True):
        """`drafter` False: no request runs the engine's Medusa heads or EAGLE draft (plain decoding, or a drafter
        with no graph of its own), so workers spin as on an engine without them."""
        self.engine_dir = Path(engine_dir)
        self.manifest: Manifest = read_manifest(self.engine_dir)
        check_decoded_on_cpu(self.manifest, self.engine_dir)
        files = self.manifest.files
        drafter_graphs = [role for role in ("draft_context", "draft_generation", "medusa", "redrafter") if role in files]
        if spin is None and drafter and drafter_graphs and effective_spin(None):
            # every step also runs the drafter's own session; two sessions' spinning pools take each other's cores
            # and slow decoding to a fraction, so a drafter engine spins only when asked to (--spin)
            log.info("%s: the drafter runs in its own ONNX Runtime session; intra-op workers do not spin (pass "
                     "--spin to force it)", self.engine_dir)
            spin = False
        # spin None: TRTSPEC_ORT_SPIN decides (default: spin); the manifest says which of trtspec's own kernels it runs
        options = session_options(threads, spin, native_ops=bool(self.manifest.native_ops))
        self.threads, self.spin = options.intra_op_num_threads, effective_spin(spin)
        graph = lambda role: _Graph(self.engine_dir / files[role], options) if role in files else None  # noqa: E731
        self._context, self._generation = graph("context"), graph("generation")
        self._draft_context, self._draft_generation = graph("draft_context"), graph("draft_generation")
        self._medusa, self._redrafter = graph("medusa"), graph("redrafter")
        m, p = self.manifest.model, self.manifest.profile
        self.vocab_size, self.max_draft_len = m.vocab_size, p.max_draft_len
        self.num_medusa_heads = m.num_medusa_heads
        self.has_eagle_draft = self._draft_context is not None
        self.has_redrafter = self._redrafter is not None
        self.slot_profiles = p.slots  # ascending verify-step slot counts; a step runs the smallest that fits
        # every decode step, plain ones too, runs the generation graph: one session for the whole decode matters
        # with spinning workers, as a session's spinning pool takes the cores another session's run needs.
        # Quantized weights: a plain step must compute its token as a verify step's first slot does (see
        # EngineWeights.min_step_slots), so that speculation stays lossless: 1 slot where the graph's attention
        # computes one row as many (TreeAttention, or GroupQueryAttention padded inside the graph) and this host's
        # kernels compute one row as they do many, else 2 slots (one masked)
        self._min_slots = self._plain_step_slots()
        if self.manifest.matmul_kernel == MATMUL_BLOCK and not native.block_matmul_vectorized():
            log.warning("%s: built with --native-matmul, whose BlockMatMul runs a portable loop on this CPU (no "
                        "AVX-512 VNNI): it is slower than MatMulNBits; rebuild without the flag here",
                        self.engine_dir)
        # ... which makes a chain's slots exact, not a tree's second branches: drafters draft chains on such engines
        self.chains_only = self.manifest.chains_only
        self._size = p.max_seq_len + p.tokens_per_step  # room for one padded step past max_seq_len
        self._costs = None
        self._seqs: dict[int, _Sequence] = {}
        self._ids = itertools.count()
        # the pool's pages are touched only as rows fill (np.zeros maps zero pages lazily)
        self._pool = _Cache.allocate(m.num_layers, self._size, m.num_kv_heads, m.head_dim, p.max_batch_size)
        self._draft_pool = (_Cache.allocate(m.draft_layers, self._size, m.draft_num_kv_heads, m.draft_head_dim,
                                            p.max_batch_size) if self.has_eagle_draft else None)
        self._rows: list[int] = []  # _rows[r] = the sequence in pool row r; rows 0..len-1 are taken
        self._staging: dict[int, _Cache] = {}  # batch size → a staging cache for batches not in the pool's rows

    @property
    def profile(self):
        return self.manifest.profile

    def use_step_costs(self, costs) -> None:
        """Budget drafts against this curve instead of the measured one: a recipe gate replays the curve its
        baseline was measured with, so τ depends on the code, not on how busy the machine is."""
        if tuple(costs.profiles[1:]) != tuple(s for s in self.slot_profiles if s > 1):
            raise ConfigError(f"a verify curve over slot profiles {list(costs.profiles[1:])} does not fit this engine's "
                              f"{list(self.slot_profiles)}")
        self._costs = costs

    def step_costs(self):
        """The verify step's cost per slot profile relative to a plain step (`verify_curve`): measured once on this
        machine and cached beside the engine."""
        if self._costs is None:
            from trtspec.runtime.verify_curve import load_or_measure

            self._costs = load_or_measure(self)
        return self._costs

    @property
    def kv_rows(self) -> tuple[int, int]:
        """(rows of the KV pool in use, rows in all): one per open sequence, up to max_batch_size."""
        return len(self._rows), self._pool.kv.shape[2]

    def open(self) -> int:
        m = self.manifest.model
        seq = next(self._ids)
        row = len(self._rows) if len(self._rows) < self._pool.kv.shape[2] else None
        if row is None:
            base = _Cache.allocate(m.num_layers, self._size, m.num_kv_heads, m.head_dim)
            draft = (_Cache.allocate(m.draft_layers, self._size, m.draft_num_kv_heads, m.draft_head_dim)
                     if self.has_eagle_draft else None)
        else:
            base, draft = self._pool.rows(row, 1), self._draft_pool.rows(row, 1) if self.has_eagle_draft else None
            self._rows.append(seq)
        self._seqs[seq] = _Sequence(base, draft, row=row)
        return seq

    def close(self, seq: int) -> None:
        """Forget the sequence; if it held a pool row, the last row's sequence moves into it (rows stay dense)."""
        state = self._seqs.pop(seq, None)
        if state is None or state.row is None:
            return
        last = self._rows.pop()
        if last != seq:
            moved = self._seqs[last]
            moved.base = _move_row(moved.base, self._pool, state.row, moved.base.length + moved.pending)
            if moved.draft is not None:
                moved.draft = _move_row(moved.draft, self._draft_pool, state.row, moved.draft.length)
            moved.row, self._rows[state.row] = state.row, last

    def prefill(self, seq: int, token_ids: np.ndarray) -> StepOutput:
        t = len(token_ids)
        if not 1 <= t <= self.manifest.profile.max_input_len:
            raise RuntimeEngineError(f"prompt of {t} tokens; the engine takes 1..{self.manifest.profile.max_input_len} "
                                     "(max_input_len in the manifest)")
        cache = self._seqs[seq].base
        out = self._context.run(_feeds(token_ids, cache.length), cache)
        cache.length += t
        return _step(out, t)

    def verify(self, seq: int, tokens: np.ndarray, depths: np.ndarray, mask: np.ndarray) -> StepOutput:
        state = self._seqs[seq]
        cache, n = state.base, len(tokens)
        self._check_room(cache, n)
        slots = self.profile.profile_for(n)
        if n == 1:  # a step without a draft: one token, no padding
            out = self._plain_step(tokens[None], [cache.length], cache)
        else:
            ids, pos, tree = _pad(tokens, cache.length + np.asarray(depths), mask, slots)
            out = self._generation.run(_feeds(ids, cache.length, pos, tree), cache)
        state.pending = n
        return _step(out, n, slots)

    def verify_batch(self, items: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]) -> list[StepOutput]:
        """One graph run over several sequences' drafts (seq, tokens, depths, mask) in one batch.

        When the sequences hold consecutive rows of the pool (every open sequence does, in any order) the graph runs
        over those rows in place; otherwise their pasts are gathered into a staging cache [L, 2, B, nkv, S_max, hd]
        (each row's own length; GroupQueryAttention reads no further) and their new rows scattered back after the
        run. Either way each row's new K/V lands after its own past; commit then works per sequence as usual."""
        states = [self._seqs[seq] for seq, *_ in items]
        for state, (_, tokens, _, _) in zip(states, items):
            self._check_room(state.base, len(tokens))
        slots = self.profile.profile_for(max(len(tokens) for _, tokens, _, _ in items))
        run = self._generation.run
        if slots == 1:
            run = lambda feeds, cache: self._plain_step(feeds["input_ids"], feeds["past_lengths"], cache)  # noqa: E731
        first = _pool_block(states)
        if first is not None:  # batch row b is pool row first + b: run in place
            at = [state.row - first for state in states]  # items[i] runs as batch row at[i]
            ordered, lengths = [None] * len(items), [0] * len(items)
            for b, item, state in zip(at, items, states):
                ordered[b], lengths[b] = item, state.base.length
            out = run(_batch_feeds(ordered, lengths, slots), self._pool.rows(first, len(items)))
        else:
            lengths = [state.base.length for state in states]
            staging = self._staging_cache(len(items))
            for b, (state, n) in enumerate(zip(states, lengths)):  # gather the pasts
                staging.kv[:, :, b, :, :n] = state.base.kv[:, :, 0, :, :n]
            out = run(_batch_feeds(items, lengths, slots), staging)
            for b, (state, n) in enumerate(zip(states, lengths)):  # scatter the new rows
                state.base.kv[:, :, 0, :, n:n + slots] = staging.kv[:, :, b, :, n:n + slots]
            at = np.arange(len(items))
        for state, (_, tokens, _, _) in zip(states, items):
            state.pending = len(tokens)
        return [StepOutput(out["logits"][b, :len(t)].copy(), out["hidden"][b, :len(t)].copy(), slots)
                for b, (_, t, _, _) in zip(at, items)]

    def _plain_step(self, ids: np.ndarray, lengths, cache: _Cache) -> dict[str, np.ndarray]:
        """One token per row [B, 1] after each row's past: a trivial tree in the generation graph, padded to
        `_min_slots` slots that are masked and seen by nobody (as in _pad)."""
        return self._generation.run_plain(ids, lengths, cache, self._min_slots)

    def _plain_step_slots(self) -> int:
        """Slots a plain step feeds (the generation graph's T). Quantized weights need 2 so that a token is computed
        as in a verify step: ONNX Runtime's GroupQueryAttention takes another path for one row, and its 4-bit
        MatMulNBits kernels may on some CPUs. The build pads GroupQueryAttention to 2 rows inside the graph
        (Manifest.attention_rows), which leaves the products (as does TreeAttention, whose one-row path is its many-row
        path): one slot is fed when a plain step of one slot gives bit-identical logits to the same token fed as 2
        slots on this host (checked here once, on a scratch cache); else 2 slots."""
        need = self.manifest.weights.min_step_slots
        if need == 1:
            return need
        m, vocab = self.manifest.model, self.manifest.model.vocab_size
        cache = _Cache.allocate(m.num_layers, 16, m.num_kv_heads, m.head_dim)
        prompt = (np.arange(5, dtype=np.int64) * 7919 + 11) % vocab
        self._context.run(_feeds(prompt, 0), cache)
        token, past = np.array([[int(prompt[-1])]], np.int64), np.array([len(prompt)], np.int32)
        one, two = (self._generation.run_plain(token, past, cache, slots)["logits"][0, 0].copy() for slots in (1, 2))
        for graph in (self._context, self._generation):  # the scratch cache's bindings
            for key in [k for k in graph._bindings if k[0] == cache.address]:
                del graph._bindings[key]
        alike = bool(np.array_equal(one, two))
        # the usual outcome is a debug line (it came on every load); the padded fallback is worth saying
        log.log(logging.DEBUG if alike else logging.INFO, "plain steps feed %d slot%s: one slot %s two on this CPU",
                1 if alike else need, "" if alike else "s",
                "computes exactly as" if alike else "does not compute exactly as")
        return 1 if alike else need

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
        return self.medusa_logits_batch(np.asarray(hidden)[None])[0]  # [heads, V]

    def medusa_logits_batch(self, hidden: np.ndarray) -> np.ndarray:
        """The heads' logits [rows, heads, V] over several final hidden states [rows, H] in one run (the heads'
        shared lm_head is read once for all of them)."""
        (logits,) = self._medusa.session.run(None, {"hidden": np.asarray(hidden, np.float32)})
        return logits.transpose(1, 0, 2)  # [heads, rows, V] → [rows, heads, V]

    def redrafter_step(self, hidden: np.ndarray, tokens: np.ndarray, state: np.ndarray,
                       has_state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ReDrafter: one beam-search step of the drafter over N beams (onnx_graph.redrafter_graph)."""
        logits, next_state = self._redrafter.session.run(None, {
            "hidden": np.asarray(hidden, np.float32), "tokens": np.asarray(tokens, np.int64),
            "state": np.asarray(state, np.float32), "has_state": np.asarray(has_state, np.float32)})
        return logits, next_state

    def draft_extend(self, seq: int, token_ids: np.ndarray, features: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        t = len(token_ids)
        self._check_room(cache, t)
        feeds = {**_feeds(token_ids, cache.length), "features": np.asarray(features, np.float32)[None],
                 "logit_rows": np.array([t - 1], np.int64)}
        out = self._draft_context.run(feeds, cache)
        cache.length += t
        return _step(out, t)

    def draft_extend_batch(self, items: list[tuple[int, np.ndarray, np.ndarray]]) -> list[StepOutput]:
        """`draft_extend` for several sequences (seq, token_ids, features) in one run of the draft context graph
        when they hold consecutive pool rows (else one run each). Rows with fewer entries are padded at the end:
        the padding is causal-after every real entry and lands past the row's new length, so nothing reads it."""
        states = [self._seqs[seq] for seq, _, _ in items]
        first = _pool_block(states)
        if len(items) == 1 or first is None:
            return [self.draft_extend(*item) for item in items]
        t = max(len(tokens) for _, tokens, _ in items)
        for state in states:
            self._check_room(state.draft, t)
        ids, lengths = np.zeros((len(items), t), np.int64), np.zeros(len(items), np.int32)
        last = np.zeros(len(items), np.int64)
        feats = np.zeros((len(items), t, items[0][2].shape[-1]), np.float32)
        for state, (_, tokens, features) in zip(states, items):
            b = state.row - first
            ids[b, :len(tokens)], feats[b, :len(tokens)], lengths[b] = tokens, features, state.draft.length
            last[b] = len(tokens) - 1
        out = self._draft_context.run({"input_ids": ids, "features": feats, "past_lengths": lengths,
                                       "logit_rows": last}, self._draft_pool.rows(first, len(items)))
        results = []
        for state, (_, tokens, _) in zip(states, items):
            b, n = state.row - first, len(tokens)
            state.draft.length += n
            results.append(StepOutput(out["logits"][b, :n].copy(), out["hidden"][b, :n].copy()))
        return results

    def draft_step(self, seq: int, token_ids: np.ndarray, features: np.ndarray, depths: np.ndarray,
                   mask: np.ndarray) -> StepOutput:
        cache = self._seqs[seq].draft
        m = len(token_ids)
        slots = self.profile.profile_for(max(m, 2))
        self._check_room(cache, slots)
        ids, pos, tree = _pad(token_ids, cache.length + np.asarray(depths) - 1, mask, slots)
        feats = np.zeros((1, slots, features.shape[-1]), np.float32)
        feats[0, :m] = features
        feeds = {**_feeds(ids, cache.length, pos, tree), "features": feats}
        return _step(self._draft_generation.run(feeds, cache), m, slots)  # scratch rows, not committed

    def _check_room(self, cache: _Cache, tokens: int) -> None:
        """The committed length must stay below max_seq_len; a step's slots may use the buffer's spare K + 1."""
        if cache.length >= self.manifest.profile.max_seq_len or cache.length + tokens > self._size:
            raise RuntimeEngineError(f"sequence of {cache.length} tokens cannot take {tokens} more: "
                                     f"max_seq_len is {self.manifest.profile.max_seq_len}")


def _pool_block(states: list[_Sequence]) -> int | None:
    """The first pool row when the sequences hold consecutive pool rows (in any order), else None."""
    rows = [state.row for state in states]
    if None in rows or max(rows) - min(rows) != len(rows) - 1 or len(set(rows)) != len(rows):
        return None
    return min(rows)


def _move_row(cache: _Cache, pool: _Cache, row: int, rows: int) -> _Cache:
    """Copy the first `rows` positions of a one-row cache into pool row `row`; return that row as the cache."""
    pool.kv[:, :, row, :, :rows] = cache.kv[:, :, 0, :, :rows]
    return _Cache(pool.kv[:, :, row:row + 1], cache.length)


def _feeds(ids, past: int, positions=None, tree=None) -> dict[str, np.ndarray]:
    """Graph inputs for one sequence with `past` committed rows; positions and tree mask for generation graphs."""
    feeds = {"input_ids": np.asarray(ids, np.int64)[None], "past_lengths": np.array([past], np.int32)}
    if tree is not None:
        feeds["position_ids"], feeds["tree_mask"] = np.asarray(positions, np.int64)[None], tree[None]
    return feeds


def _batch_feeds(items, lengths: list[int], slots: int) -> dict[str, np.ndarray]:
    """Graph inputs for a batch: row b after its own past (lengths[b] rows) with its padded draft."""
    batch = len(items)
    ids, pos = np.zeros((batch, slots), np.int64), np.zeros((batch, slots), np.int64)
    tree = np.zeros((batch, slots, slots), bool)  # [B, T, T]
    for b, (_, tokens, depths, tree_mask) in enumerate(items):
        ids[b], pos[b], tree[b] = _pad(tokens, lengths[b] + np.asarray(depths), tree_mask, slots)
    feeds = {"input_ids": ids, "past_lengths": np.asarray(lengths, np.int32)}
    return feeds if slots == 1 else {**feeds, "position_ids": pos, "tree_mask": tree}


def _pad(tokens, positions, mask: np.ndarray, slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad n slots to the static `slots`: padded slots see only themselves and nobody sees them.

    GroupQueryAttention is causal under the tree mask, so a slot may see only itself and earlier slots: trees
    list parents before children."""
    n = len(tokens)
    assert mask.diagonal().all() and not np.triu(mask, 1).any(), "a tree slot sees a later slot or not itself"
    ids, pos = np.zeros(slots, np.int64), np.full(slots, positions[0], np.int64)
    ids[:n], pos[:n] = tokens, positions
    full = np.eye(slots, dtype=bool)
    full[:n, :n] = mask
    return ids, pos, full


def _step(out: dict[str, np.ndarray], n: int, slots: int = 0) -> StepOutput:
    """The first n slots' outputs, copied: the bound output arrays are overwritten by the graph's next run."""
    return StepOutput(out["logits"][0, :n].copy(), out["hidden"][0, :n].copy(), slots)
