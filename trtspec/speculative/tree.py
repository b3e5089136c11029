"""Draft trees: Medusa / EAGLE-1 choices → the buffers the verify step needs (pure numpy).

Conventions follow TensorRT-LLM's `initTensorsFromChoices` (C++) and `_medusa_setup` (Python): node 0 is the
root (the token the target sampled last step), node i ≥ 1 is the i-th choice in (length, lexicographic) order.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from numbers import Integral

import numpy as np

from trtspec.errors import ConfigError

# TRT-LLM's C++ builds a node's sort key from 4-bit chunks of a uint64 (PREFIX_CHUNK_SIZE_BITS = 4,
# PREFIX_MAX_VALUE = 16), which bounds both the rank per level and the depth (64 / 4).
MAX_RANK = 16
MAX_DEPTH = 16

Choice = tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Tree:
    """A static draft tree and its verify-step buffers; equal trees have equal choices."""

    choices: tuple[Choice, ...]
    num_nodes: int
    depth: int
    topks: tuple[int, ...]
    parents: np.ndarray           # int64 [n+1], parents[0] = -1
    position_offsets: np.ndarray  # int64 [n+1], node depth
    ranks: np.ndarray             # int64 [n+1], c[-1] per node, root 0
    tree_ids: np.ndarray          # int64 [n], index into concat(top-k of head 0, top-k of head 1, ...)
    paths: np.ndarray             # int64 [num_leaves, depth+1], root→leaf node indices, -1 padded
    mask: np.ndarray              # bool [n+1, n+1], row i = i and its ancestors
    packed_mask: np.ndarray       # int32 [n+1, ceil((n+1)/32)]
    children: tuple[tuple[int, ...], ...]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tree) and self.choices == other.choices

    def __hash__(self) -> int:
        return hash(self.choices)

    @property
    def num_leaves(self) -> int:
        return int(self.paths.shape[0])

    def packed_mask_words(self, num_words: int) -> np.ndarray:
        """The packed mask with `num_words` int32 words per row, e.g. ceil((K+1)/32) for a static-K profile."""
        return pack_mask(self.mask, num_words)

    def nodes_per_level(self) -> tuple[int, ...]:
        """Node count at depth 1..depth."""
        return tuple(int(x) for x in np.bincount(self.position_offsets, minlength=self.depth + 1)[1:])

    def non_leaves_per_level(self) -> tuple[int, ...]:
        """Nodes with children at depth 0..depth-1 (the root level included, as TRT-LLM counts it)."""
        counts = [0] * self.depth
        for node, kids in enumerate(self.children):
            if kids:
                counts[int(self.position_offsets[node])] += 1
        return tuple(counts)

    def summary(self) -> dict[str, object]:
        """Human-readable facts about the tree, in display order."""
        return {"nodes": self.num_nodes, "depth": self.depth, "nodes per level": list(self.nodes_per_level()),
                "topks": list(self.topks), "leaves (paths)": self.num_leaves,
                "non-leaves per level": list(self.non_leaves_per_level()),
                "packed-mask words": int(self.packed_mask.shape[1])}

    def to_json_dict(self) -> dict:
        """The buffers as JSON-serialisable lists (mask as 0/1)."""
        return {"num_nodes": self.num_nodes, "topks": list(self.topks),
                "position_offsets": self.position_offsets.tolist(), "tree_ids": self.tree_ids.tolist(),
                "paths": self.paths.tolist(), "mask": self.mask.astype(int).tolist(),
                "packed_mask": self.packed_mask.tolist()}


def build_tree(choices: Iterable[Sequence[int]], *, num_heads: int | None = None,
               max_draft_len: int | None = None, max_non_leaves_per_layer: int | None = None,
               exact_depth: int | None = None) -> Tree:
    """Validate `choices` (full or paths-only style) and build the tree buffers.

    num_heads: Medusa heads available (depth must not exceed it); max_draft_len: K (node count must not
    exceed it); max_non_leaves_per_layer: EAGLE's expansion limit; exact_depth: EAGLE-1's num_eagle_layers.
    """
    raw = _as_choices(choices)
    _check_unique(raw)
    _check_trtllm_limits(raw)
    full = [tuple(c) for c in expand_choices(raw)]
    _check_parents(full)
    tree = _make_tree(full)
    _check_against_engine(tree, num_heads, max_draft_len, max_non_leaves_per_layer, exact_depth)
    return tree


def chain_tree(length: int) -> Tree:
    """A linear draft of `length` tokens, [[0], [0, 0], ...]; length 0 is the root alone.

    A chain is not bound by the Medusa/EAGLE choice limits (16 levels), so draft-model and n-gram drafts
    of any length get one.
    """
    if isinstance(length, bool) or not isinstance(length, Integral) or length < 0:
        raise ConfigError(f"chain length must be a non-negative int, got {length!r}")
    return _make_tree([(0,) * d for d in range(1, int(length) + 1)])


EMPTY_CHOICES: tuple[Choice, ...] = ()


@lru_cache(maxsize=4096)
def tree_from_choices(choices: tuple[Choice, ...]) -> Tree:
    """The tree of a complete, (length, lexicographic)-sorted tuple of choices, unvalidated and cached: for drafters
    that lay out a fresh tree every step (n-gram, Token Recycling), whose shapes recur."""
    return _make_tree(list(choices))


def expand_choices(choices: Iterable[Sequence[int]]) -> list[list[int]]:
    """Add every prefix to a paths-only list; return a full (vanilla) list unchanged.

    Decided as TRT-LLM's `expand_choices_if_needed` does: the list is vanilla iff, for the first choice
    longer than 1, its first step `[c[0]]` is listed. An expanded list comes back sorted by (len, c).
    """
    raw = _as_choices(choices)
    listed = set(raw)
    first_long = next((c for c in raw if len(c) > 1), None)
    if first_long is not None and first_long[:1] in listed:
        return [list(c) for c in raw]
    prefixes = {c[:d] for c in raw for d in range(1, len(c) + 1)}
    return [list(c) for c in sorted(prefixes, key=_order)]


def pack_mask(mask: np.ndarray, num_words: int | None = None) -> np.ndarray:
    """Pack a bool [rows, cols] mask into int32 words: bit b of word w is column 32w + b (LSB first)."""
    mask = np.asarray(mask, dtype=bool)
    rows, cols = mask.shape
    needed = max(1, math.ceil(cols / 32))
    num_words = needed if num_words is None else num_words
    if num_words < needed:
        raise ConfigError(f"a mask of {cols} columns needs at least {needed} packed int32 words per row, "
                          f"got {num_words}; pass num_words >= {needed} (ceil((K+1)/32))")
    bits = np.zeros((rows, num_words * 32), dtype=np.uint64)
    bits[:, :cols] = mask
    words = (bits.reshape(rows, num_words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=-1)
    return words.astype(np.uint32).view(np.int32)  # bit 31 reads as negative, as in TRT-LLM


def parse_choices(text: str) -> list[list[int]]:
    """Parse choices written as JSON `[[0],[0,1]]`, C++ `{{0}, {0, 1}}` or Python tuples `[(0,),(0,1)]`."""
    bracketed = text.strip().replace("{", "[").replace("}", "]")
    try:
        value = ast.literal_eval(bracketed)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ConfigError(f"cannot parse tree choices {_clip(text)}; write them as JSON [[0], [0, 1]], "
                          f"C++ {{{{0}}, {{0, 1}}}} or Python [(0,), (0, 1)]") from None
    return [list(c) for c in _as_choices(value)]


# ---- building -----------------------------------------------------------------------------------------

def _order(choice: Choice) -> tuple[int, Choice]:
    return len(choice), choice


def _make_tree(full: list[Choice]) -> Tree:
    """Build the buffers from a complete (prefix-closed, duplicate-free) list of choices."""
    choices = tuple(sorted(full, key=_order))
    n = len(choices)
    index = {c: i + 1 for i, c in enumerate(choices)}
    parents = np.array([-1] + [index.get(c[:-1], 0) for c in choices], dtype=np.int64)
    offsets = np.array([0] + [len(c) for c in choices], dtype=np.int64)
    ranks = np.array([0] + [c[-1] for c in choices], dtype=np.int64)
    depth = max((len(c) for c in choices), default=0)
    topks = tuple(max(c[d] for c in choices if len(c) > d) + 1 for d in range(depth))
    level_start = np.concatenate([[0], np.cumsum(topks)]).astype(np.int64)  # [depth+1]
    tree_ids = level_start[offsets[1:] - 1] + ranks[1:]
    kids: list[list[int]] = [[] for _ in range(n + 1)]
    for node in range(1, n + 1):  # node order within a parent is rank order
        kids[int(parents[node])].append(node)
    mask = _ancestor_mask(parents)
    return Tree(choices=choices, num_nodes=n, depth=depth, topks=topks, parents=_frozen(parents),
                position_offsets=_frozen(offsets), ranks=_frozen(ranks), tree_ids=_frozen(tree_ids),
                paths=_frozen(_leaf_paths(parents, kids, depth)), mask=_frozen(mask),
                packed_mask=_frozen(pack_mask(mask)), children=tuple(tuple(k) for k in kids))


def _ancestor_mask(parents: np.ndarray) -> np.ndarray:
    """mask[i] = mask[parent(i)] plus i itself; parents precede children in node order."""
    mask = np.zeros((len(parents), len(parents)), dtype=bool)  # [n+1, n+1]
    mask[0, 0] = True
    for node in range(1, len(parents)):
        mask[node] = mask[parents[node]]
        mask[node, node] = True
    return mask


def _leaf_paths(parents: np.ndarray, kids: list[list[int]], depth: int) -> np.ndarray:
    """One root→leaf row per leaf in left-to-right DFS order, -1 padded to depth + 1."""
    rows, stack = [], [0]
    while stack:
        node = stack.pop()
        if not kids[node]:
            chain = [node]
            while chain[-1] != 0:
                chain.append(int(parents[chain[-1]]))
            rows.append(chain[::-1] + [-1] * (depth + 1 - len(chain)))
        stack.extend(reversed(kids[node]))
    return np.array(rows, dtype=np.int64).reshape(len(rows), depth + 1)


def _frozen(array: np.ndarray) -> np.ndarray:
    array.setflags(write=False)
    return array


# ---- validation ---------------------------------------------------------------------------------------

_SHAPE_HINT = "write them as a list of lists of non-negative ints, e.g. [[0], [0, 0], [1]]"


def _as_choices(choices: object) -> list[Choice]:
    """Check the shape: a list of non-empty lists of non-negative ints."""
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Iterable):
        raise ConfigError(f"tree choices must be a list, got {type(choices).__name__} {_clip(choices)}; "
                          f"{_SHAPE_HINT}")
    out = []
    for c in choices:
        if isinstance(c, (str, bytes)) or not isinstance(c, (list, tuple, np.ndarray)):
            raise ConfigError(f"tree choice {_clip(c)} is not a list; {_SHAPE_HINT}")
        if not len(c):
            raise ConfigError(f"tree choice {list(c)} is empty; the root is implicit, drop it")
        for x in c:
            if isinstance(x, bool) or not isinstance(x, Integral) or x < 0:
                raise ConfigError(f"tree choice {_clip(list(c))} holds {x!r}; ranks are non-negative ints "
                                  f"(0 = a head's top-1 candidate)")
        out.append(tuple(int(x) for x in c))
    return out


def _check_unique(raw: list[Choice]) -> None:
    seen: set[Choice] = set()
    for c in raw:
        if c in seen:
            raise ConfigError(f"tree choice {list(c)} is listed twice; remove the duplicate")
        seen.add(c)


def _check_trtllm_limits(raw: list[Choice]) -> None:
    for c in raw:
        if len(c) > MAX_DEPTH:
            raise ConfigError(f"tree choice {_clip(list(c))} has depth {len(c)}, above TensorRT-LLM's limit of "
                              f"{MAX_DEPTH} levels; shorten it")
        if max(c) > MAX_RANK:
            raise ConfigError(f"tree choice {list(c)} has rank {max(c)}, above TensorRT-LLM's limit of "
                              f"{MAX_RANK} per level; use ranks 0..{MAX_RANK}")


def _check_parents(full: list[Choice]) -> None:
    listed = set(full)
    for c in full:
        if len(c) > 1 and c[:-1] not in listed:
            raise ConfigError(f"tree choice {list(c)} needs its parent {list(c[:-1])}, which is not listed; "
                              f"add it (only a list whose first multi-step choice lacks its first step "
                              f"is read as paths-only and gets its prefixes added)")


def _check_against_engine(tree: Tree, num_heads: int | None, max_draft_len: int | None,
                          max_non_leaves: int | None, exact_depth: int | None) -> None:
    if num_heads is not None and tree.depth > num_heads:
        raise ConfigError(f"tree depth {tree.depth} exceeds the {num_heads} Medusa heads; "
                          f"pass --num-heads >= {tree.depth} or a tree of depth <= {num_heads}")
    if max_draft_len is not None and tree.num_nodes > max_draft_len:
        raise ConfigError(f"{tree.num_nodes} tree nodes need --max-draft-len >= {tree.num_nodes} "
                          f"(got {max_draft_len}); raise it or use a smaller tree")
    if max_non_leaves is not None:
        for level, count in enumerate(tree.non_leaves_per_level()):
            if count > max_non_leaves:
                raise ConfigError(f"tree level {level} has {count} non-leaf nodes, above "
                                  f"--max-non-leaves-per-layer {max_non_leaves}; raise it to >= {count} "
                                  f"or prune the tree")
    if exact_depth is not None and tree.depth != exact_depth:
        raise ConfigError(f"EAGLE-1 needs tree depth == num_eagle_layers = {exact_depth}, but the tree has "
                          f"depth {tree.depth}; pass --num-eagle-layers {tree.depth} or a tree of depth "
                          f"{exact_depth}")


def _clip(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True, kw_only=True)
class DynamicTree:
    """EAGLE-2's dynamic tree: levels drafted, nodes expanded per level (and children per node), nodes kept."""

    depth: int = 4
    top_k: int = 4
    total_tokens: int = 16

    def __post_init__(self):
        for name in ("depth", "top_k", "total_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"EAGLE-2 {name} must be >= 1, got {getattr(self, name)}")
        if self.top_k > 16 or self.depth > 16:
            raise ConfigError(f"EAGLE-2 top_k={self.top_k} / depth={self.depth} exceed the tree limit of 16")

    @classmethod
    def parse(cls, text: str, flag: str = "--eagle2") -> DynamicTree:
        """DEPTH,TOP_K,TOTAL_TOKENS as a person types it, e.g. 4,4,16."""
        try:
            depth, top_k, total = (int(x) for x in text.split(","))
        except ValueError:
            raise ConfigError(f"{flag}: expected DEPTH,TOP_K,TOTAL_TOKENS, got {text!r}") from None
        return cls(depth=depth, top_k=top_k, total_tokens=total)
