"""TreeAttention (com.trtspec), the compiled custom op, in real ONNX Runtime sessions over one-node graphs: its
numbers against a float64 reference, its cache writes, and the property it exists for: a query row's output is the
same bits however the call around it is made (1 or 17 slots, ancestors in other columns, batch 1 or 3, 1 or 2
threads, the cache appended in place or copied)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

from trtspec.model.ort_session import session_options
from trtspec.native import register
from trtspec.model.tree_attention_graph import INPUTS, SMOLLM2, AttentionShape, tree_attention_model

TINY = AttentionShape(4, 2, 8)
ODD_CHUNKS = AttentionShape(2, 1, 24)  # hd / 8 odd: the dot product's last chunk has no partner
CAPACITY, POSITIONS = 64, 96


def make_session(shape: AttentionShape, threads: int = 2, **model_options) -> ort.InferenceSession:
    options = session_options(threads=threads, spin=False)
    register(options)
    model = tree_attention_model(shape, **model_options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


_SESSIONS: dict[tuple, ort.InferenceSession] = {}


def session_for(shape: AttentionShape, threads: int = 2) -> ort.InferenceSession:
    key = (shape, threads)
    if key not in _SESSIONS:
        _SESSIONS[key] = make_session(shape, threads)
    return _SESSIONS[key]


def rotary(shape: AttentionShape, positions: int = POSITIONS) -> tuple[np.ndarray, np.ndarray]:
    half = shape.head_size // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half) / half))
    angles = np.arange(positions)[:, None] * inv_freq[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def ancestry(parents: list[int], slot: int) -> list[int]:
    """The slots from the root down to `slot` (itself included)."""
    chain = [slot]
    while parents[chain[-1]] >= 0:
        chain.append(parents[chain[-1]])
    return chain[::-1]


def tree_mask(parents: list[int]) -> np.ndarray:
    mask = np.zeros((len(parents), len(parents)), bool)
    for r in range(len(parents)):
        mask[r, ancestry(parents, r)] = True
    return mask


def random_parents(rng: np.random.Generator, slots: int) -> list[int]:
    """A tree over `slots` slots in topological order: each slot's parent is an earlier slot, or none (-1, a root
    that sees only the past). Ancestors sit at scattered, non-consecutive columns."""
    return [-1] + [int(rng.integers(-1, j)) for j in range(1, slots)]


def make_feeds(shape: AttentionShape, rng: np.random.Generator, pasts: list[int], trees: list[list[int]],
               capacity: int = CAPACITY) -> dict[str, np.ndarray]:
    """Random q/k/v and cache for batch rows with pasts `pasts` and trees `trees` (one list of parents per row,
    all of one length T); position ids are each slot's depth after its row's past."""
    batch, slots, hd = len(pasts), len(trees[0]), shape.head_size
    cos, sin = rotary(shape)
    feeds = {
        "qkv": rng.standard_normal((batch, slots, shape.qkv_width)).astype(np.float32),
        "past_key": rng.standard_normal((batch, shape.kv_num_heads, capacity, hd)).astype(np.float32),
        "past_value": rng.standard_normal((batch, shape.kv_num_heads, capacity, hd)).astype(np.float32),
        "past_lengths": np.array(pasts, np.int32),
        "position_ids": np.array([[past + len(ancestry(tree, j)) - 1 for j in range(slots)]
                                  for past, tree in zip(pasts, trees)], np.int64),
        "tree_mask": np.stack([tree_mask(tree) for tree in trees]),
        "cos_cache": cos, "sin_cache": sin,
    }
    feeds["qkv"][..., : shape.num_heads * hd] *= hd ** -0.5  # q arrives pre-scaled, as the engine's graph feeds it
    return feeds


def run(session: ort.InferenceSession, feeds: dict[str, np.ndarray], *, in_place: bool = True):
    """(attn, present_key, present_value). In place: past and present bound to one buffer (a copy of the feeds'
    past), as the runtime binds the cache; else ONNX Runtime allocates the presents."""
    if not in_place:
        return tuple(session.run(None, feeds))
    key, value = feeds["past_key"].copy(), feeds["past_value"].copy()
    arrays = {name: np.ascontiguousarray(feeds[name]) for name in INPUTS}
    arrays["past_key"], arrays["past_value"] = key, value
    batch, slots = feeds["qkv"].shape[:2]
    heads_width = (feeds["qkv"].shape[2] // feeds["past_key"].shape[3] - 2 * feeds["past_key"].shape[1]) * \
        feeds["past_key"].shape[3]
    attn = np.full((batch, slots, heads_width), np.nan, np.float32)
    io = session.io_binding()
    for name, array in arrays.items():
        io.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
    for name, array in (("attn", attn), ("present_key", key), ("present_value", value)):
        io.bind_output(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
    session.run_with_iobinding(io)
    return attn, key, value


def rope32(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Half-split RoPE in float32, each element as the op computes it (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def reference(shape: AttentionShape, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """float64 attention: RoPE on q and the new k, each row over its past and its visible slots."""
    nh, nkv, hd = shape.num_heads, shape.kv_num_heads, shape.head_size
    qkv = feeds["qkv"].astype(np.float64)
    batch, slots = qkv.shape[:2]
    cos = feeds["cos_cache"].astype(np.float64)[feeds["position_ids"]][:, :, None]  # [B, T, 1, hd/2]
    sin = feeds["sin_cache"].astype(np.float64)[feeds["position_ids"]][:, :, None]
    q = rope32(qkv[..., : nh * hd].reshape(batch, slots, nh, hd), cos, sin)
    k = rope32(qkv[..., nh * hd: (nh + nkv) * hd].reshape(batch, slots, nkv, hd), cos, sin)
    v = qkv[..., (nh + nkv) * hd:].reshape(batch, slots, nkv, hd)
    out = np.zeros((batch, slots, nh, hd))
    for b in range(batch):
        past = feeds["past_lengths"][b]
        for r in range(slots):
            seen = np.flatnonzero(feeds["tree_mask"][b, r])
            for h in range(nh):
                g = h // (nh // nkv)
                keys = np.concatenate([feeds["past_key"][b, g, :past].astype(np.float64), k[b, seen, g]])
                values = np.concatenate([feeds["past_value"][b, g, :past].astype(np.float64), v[b, seen, g]])
                scores = keys @ q[b, r, h]
                weights = np.exp(scores - scores.max())
                out[b, r, h] = weights @ values / weights.sum()
    return out.reshape(batch, slots, nh * hd)


# ---- numbers and cache writes ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [TINY, ODD_CHUNKS, SMOLLM2], ids=["tiny", "odd-chunks", "smollm2"])
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "copied"])
def test_attention_matches_a_float64_reference_and_writes_only_the_new_cache_rows(shape, in_place):
    rng = np.random.default_rng(1)
    pasts = [0, 1, 37]
    trees = [random_parents(rng, 6) for _ in pasts]
    feeds = make_feeds(shape, rng, pasts, trees)
    attn, key, value = run(session_for(shape), feeds, in_place=in_place)
    np.testing.assert_allclose(attn, reference(shape, feeds), rtol=1e-4, atol=2e-5)

    nh, nkv, hd = shape.num_heads, shape.kv_num_heads, shape.head_size
    slots = len(trees[0])
    qkv = feeds["qkv"]
    for b, past in enumerate(pasts):
        cos = feeds["cos_cache"][feeds["position_ids"][b]][:, None]  # [T, 1, hd/2]
        sin = feeds["sin_cache"][feeds["position_ids"][b]][:, None]
        new_keys = rope32(qkv[b, :, nh * hd: (nh + nkv) * hd].reshape(slots, nkv, hd), cos, sin)
        new_values = qkv[b, :, (nh + nkv) * hd:].reshape(slots, nkv, hd)
        # the new rows, bit for bit (the same float32 operations), at past + j ...
        assert np.array_equal(key[b, :, past: past + slots], new_keys.transpose(1, 0, 2))
        assert np.array_equal(value[b, :, past: past + slots], new_values.transpose(1, 0, 2))
        # ... and every other row as it was
        for cache, fed in ((key, feeds["past_key"]), (value, feeds["past_value"])):
            assert np.array_equal(cache[b, :, :past], fed[b, :, :past])
            assert np.array_equal(cache[b, :, past + slots:], fed[b, :, past + slots:])


def test_a_row_with_no_past_and_only_itself_visible_is_its_own_value():
    rng = np.random.default_rng(2)
    feeds = make_feeds(TINY, rng, [0], [[-1]])
    attn, _, _ = run(session_for(TINY), feeds)
    nh, nkv, hd = TINY.num_heads, TINY.kv_num_heads, TINY.head_size
    v = feeds["qkv"][0, 0, (nh + nkv) * hd:].reshape(nkv, hd)
    assert np.array_equal(attn[0, 0].reshape(nh, hd), np.repeat(v, nh // nkv, axis=0))


# ---- bit-identity: a row's output does not depend on the call around it -------------------------------------------
def chain_rows(session, feeds: dict[str, np.ndarray], b: int, parents: list[int], slot: int):
    """Slot `slot` of row b computed as plain decoding would: its ancestors appended to the cache one 1-slot call at
    a time, at consecutive positions, then the slot itself in a 1-slot call. Returns (its attention row, the cache
    rows its ancestors and it were written to: key [nkv, depth + 1, hd])."""
    past = int(feeds["past_lengths"][b])
    key, value = feeds["past_key"][b: b + 1].copy(), feeds["past_value"][b: b + 1].copy()
    attn = None
    chain = ancestry(parents, slot)
    for depth, s in enumerate(chain):
        step = {"qkv": feeds["qkv"][b: b + 1, s: s + 1], "past_key": key, "past_value": value,
                "past_lengths": np.array([past + depth], np.int32),
                "position_ids": np.array([[past + depth]], np.int64), "tree_mask": np.ones((1, 1, 1), bool),
                "cos_cache": feeds["cos_cache"], "sin_cache": feeds["sin_cache"]}
        attn, key, value = run(session, step)
    return attn[0, 0], key[0, :, past: past + len(chain)]


@pytest.mark.parametrize("slots", [1, 2, 5, 17])
def test_a_tree_slot_equals_the_same_token_decoded_one_slot_at_a_time(slots):
    rng = np.random.default_rng(slots)
    session = session_for(SMOLLM2)
    parents = random_parents(rng, slots)
    if slots == 17:  # and a deep branch whose ancestors sit far apart: 0 → 5 → 11 → 16
        parents[5], parents[11], parents[16] = 0, 5, 11
    feeds = make_feeds(SMOLLM2, rng, [23], [parents])
    attn, key, _ = run(session, feeds)
    past = 23
    for slot in range(slots):
        row, chain_keys = chain_rows(session, feeds, 0, parents, slot)
        assert np.array_equal(attn[0, slot], row), f"slot {slot} (ancestors {ancestry(parents, slot)})"
        # the ancestors' keys, written at scattered columns by the tree call, are the chain's keys bit for bit
        assert np.array_equal(key[0, :, [past + s for s in ancestry(parents, slot)]].transpose(1, 0, 2), chain_keys)


def test_a_batch_row_equals_the_same_row_alone():
    """Batch 3 (rows of different pasts and trees; the op splits work by kv head) against each row alone (the op
    splits by query head)."""
    rng = np.random.default_rng(7)
    session = session_for(SMOLLM2)
    pasts, trees = [0, 41, 9], [random_parents(rng, 5) for _ in range(3)]
    feeds = make_feeds(SMOLLM2, rng, pasts, trees)
    attn, key, value = run(session, feeds)
    for b in range(3):
        alone = {name: array[b: b + 1] for name, array in feeds.items() if name not in ("cos_cache", "sin_cache")}
        alone |= {"cos_cache": feeds["cos_cache"], "sin_cache": feeds["sin_cache"]}
        row_attn, row_key, row_value = run(session, alone)
        assert np.array_equal(attn[b], row_attn[0])
        assert np.array_equal(key[b], row_key[0]) and np.array_equal(value[b], row_value[0])


def test_one_thread_and_two_threads_give_the_same_bits():
    rng = np.random.default_rng(8)
    feeds = make_feeds(SMOLLM2, rng, [3, 30, 17, 0], [random_parents(rng, 5) for _ in range(4)])
    one = run(session_for(SMOLLM2, threads=1), feeds)
    two = run(session_for(SMOLLM2, threads=2), feeds)
    for a, b in zip(one, two):
        assert np.array_equal(a, b)


def test_in_place_and_copied_caches_give_the_same_bits():
    rng = np.random.default_rng(9)
    feeds = make_feeds(SMOLLM2, rng, [12, 5], [random_parents(rng, 4) for _ in range(2)])
    in_place = run(session_for(SMOLLM2), feeds, in_place=True)
    copied = run(session_for(SMOLLM2), feeds, in_place=False)
    for a, b in zip(in_place, copied):
        assert np.array_equal(a, b)
    assert not np.shares_memory(copied[1], feeds["past_key"])


# ---- bad input: an error from ONNX Runtime, not a crash ----------------------------------------------------------
def test_a_head_size_known_from_the_graph_that_is_not_a_multiple_of_8_fails_the_session():
    with pytest.raises(Exception, match="head size 60"):
        make_session(AttentionShape(2, 1, 60))


def test_a_head_size_seen_at_run_time_that_is_not_a_multiple_of_8_fails_the_run():
    shape = AttentionShape(2, 1, 60)
    session = make_session(shape, cache_head_size="hd")
    feeds = make_feeds(shape, np.random.default_rng(3), [4], [[-1, 0]])
    with pytest.raises(Exception, match="head size 60 is not a positive multiple of 8"):
        run(session, feeds)


@pytest.mark.parametrize("bad", ["value-capacity", "past-too-long", "position", "mask", "lengths"])
def test_inconsistent_inputs_fail_the_run_with_the_reason(bad):
    rng = np.random.default_rng(4)
    feeds = make_feeds(TINY, rng, [4, 6], [[-1, 0], [-1, 0]])
    expected = {
        "value-capacity": "past_value has shape",
        "past-too-long": "is outside the cache",
        "position": "outside the rotary cache",
        "mask": "tree_mask has shape",
        "lengths": "past_lengths has shape",
    }[bad]
    if bad == "value-capacity":
        feeds["past_value"] = feeds["past_value"][:, :, :-1].copy()
    elif bad == "past-too-long":
        feeds["past_lengths"][1] = CAPACITY + 1
    elif bad == "position":
        feeds["position_ids"][0, 1] = POSITIONS
    elif bad == "mask":
        feeds["tree_mask"] = np.ones((2, 2, 3), bool)
    else:
        feeds["past_lengths"] = np.array([4, 6, 1], np.int32)
    with pytest.raises(Exception, match=expected):
        run(make_session(TINY), feeds, in_place=False)


def test_a_present_not_bound_to_the_past_grows_to_hold_the_new_slots():
    """As GroupQueryAttention's: unbound, the present has max(capacity, past + T) rows, the past copied into it and the
    new rows after each row's past (the build's check feeds a cache of the past's rows only); bound to the past's
    buffer, slots that do not fit are an error, not a write past its end."""
    rng = np.random.default_rng(11)
    feeds = make_feeds(TINY, rng, [6, 3], [[-1, 0, 1], [-1, 0, 0]], capacity=6)
    attn, key, value = run(make_session(TINY), feeds, in_place=False)
    assert key.shape == value.shape == (2, TINY.kv_num_heads, 9, TINY.head_size)
    np.testing.assert_array_equal(key[0, :, :6], feeds["past_key"][0])
    np.testing.assert_array_equal(value[1, :, :3], feeds["past_value"][1, :, :3])
    np.testing.assert_allclose(attn, reference(TINY, feeds), rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match="do not fit|computed output shape"):  # ONNX Runtime checks it first
        run(make_session(TINY), feeds, in_place=True)
