"""Lookahead decoding (Fu et al., ICML 2024) with TensorRT-LLM's (W, N, G): Jacobi guesses and an n-gram pool, on
the same padded verify step as every other drafter.

A window of N − 1 levels of W guesses is laid out as a tree below the root (the lookahead branch: one verify step
advances every guess by one Jacobi iteration), the pool's n-grams that start with the root as chains beside it (the
verification branch); every column then yields an n-gram for the pool. A step carries at most (W + G)(N − 1) slots,
TensorRT-LLM's `maxDecodingTokens`. Drafts are deterministic token choices: greedy output is plain greedy output.
The window, the pool and how the window moves, in detail: docs/drafting.md.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.ngram_proposer import _Node, _tree_of
from trtspec.speculative.proposer import Draft

LOOKAHEAD, VERIFY = "lookahead", "verify"  # node kinds
POOL_PER_TOKEN = 16  # n-grams kept per first token (TensorRT-LLM keeps a bounded pool too)


@dataclass(frozen=True)
class LookaheadConfig:
    """TensorRT-LLM's lookahead (W, N, G): window size, n-gram size, verification set size."""

    window_size: int = 4
    ngram_size: int = 3
    verification_set_size: int = 4

    def __post_init__(self):
        # TensorRT-LLM's range: (2, 2, 1) is the smallest configuration that drafts anything
        for name, low in (("window_size", 2), ("ngram_size", 2), ("verification_set_size", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ConfigError(f"lookahead {name} must be an int >= {low}, got {value!r}")
        if self.window_size + self.ngram_size - 3 > 16 or self.verification_set_size + 2 > 16:
            raise ConfigError(f"lookahead (W, N, G) = {self.as_text()} exceeds the draft-tree limits (a column "
                              f"W + N - 3 = {self.window_size + self.ngram_size - 3} deep, G + 2 = "
                              f"{self.verification_set_size + 2} branches at the root; at most 16 each)")

    @property
    def max_decoding_tokens(self) -> int:
        """Slots of a full step, the root included: (W + G)(N - 1)."""
        return (self.window_size + self.verification_set_size) * (self.ngram_size - 1)

    @property
    def max_draft_len(self) -> int:
        """K = (N - 2) + (W - 1 + G)(N - 1), as TensorRT-LLM computes it."""
        return self.max_decoding_tokens - 1

    def as_text(self) -> str:
        return f"{self.window_size},{self.ngram_size},{self.verification_set_size}"

    @classmethod
    def parse(cls, text: str, where: str = "--lookahead") -> LookaheadConfig:
        try:
            w, n, g = (int(x) for x in str(text).split(","))
        except ValueError:
            raise ConfigError(f"{where} {text!r}: expected W,N,G (three integers, e.g. 4,3,4)") from None
        return cls(w, n, g)

    def check_fits(self, max_draft_len: int, limit: LookaheadConfig | None = None, where: str = "lookahead") -> None:
        """Refuse a configuration the engine cannot run: above its K, or (when it was built for one) above its
        own (W, N, G) in any of the three."""
        if self.max_draft_len > max_draft_len:
            raise ConfigError(f"{where} (W, N, G) = {self.as_text()} drafts up to {self.max_draft_len} tokens a step "
                              f"((W + G)(N - 1) - 1) but the engine's max_draft_len is {max_draft_len}; choose a "
                              "smaller one or rebuild with a larger --max-draft-len")
        if limit is not None:
            for name in ("window_size", "ngram_size", "verification_set_size"):
                if getattr(self, name) > getattr(limit, name):
                    raise ConfigError(f"{where} {name} {getattr(self, name)} exceeds the engine's "
                                      f"{getattr(limit, name)} (built for (W, N, G) = {limit.as_text()})")


class LookaheadProposer:
    """Jacobi lookahead plus n-gram verification over one sequence (module docstring).

    Its window's guesses are worth more than their own acceptance (they become the pool's n-grams), so a back-off
    (`speculative.backoff`) takes its draft whole or not at all (`prunable`); while it rests, `defer` / `catch_up`
    add the committed text's n-grams to the pool and restart the window from its newest tokens."""

    prunable = False

    @property
    def max_nodes(self) -> int:
        """The most nodes a step drafts (fewer where the window and the pool's n-grams share a prefix)."""
        return self.config.max_draft_len

    def __init__(self, config: LookaheadConfig = LookaheadConfig()):
        self.config = config
        w, n = config.window_size, config.ngram_size
        self.levels = np.zeros((n - 1, w), np.int64)  # levels[0, 0] stands for the root
        self.pool: dict[int, deque] = {}
        self._draft: Draft | None = None
        self._slot_of: dict[tuple[int, int], int] = {}  # (level, column) → the draft slot that holds it

    def start(self, engine, seq, prefill, prompt_ids, root) -> None:
        self.tokens = [int(t) for t in np.asarray(prompt_ids).tolist()] + [int(root)]
        self._learn_text(0)
        self._restart_window()

    def _learn_text(self, since: int) -> None:
        """Remember the n-grams of the text that end at position `since` or later."""
        text, n = self.tokens, self.config.ngram_size
        for i in range(max(since - n + 1, 0), len(text) - n + 1):
            self._remember(text[i:i + n])

    def _restart_window(self) -> None:
        """Guesses from the text's newest tokens (Fu et al. initialise the window from the prompt), newest last."""
        text = self.tokens
        guesses = (text * (self.levels.size // len(text) + 1))[-self.levels.size:]
        self.levels[:] = np.asarray(guesses, np.int64).reshape(self.levels.shape)

    # while a back-off rests the drafter: only the committed tokens are kept, then learnt in one go
    @staticmethod
    def defer(verify, accepted) -> list[int]:
        return [int(t) for t in accepted.tokens]

    def catch_up(self, entries: list[list[int]]) -> None:
        since = len(self.tokens)
        for tokens in entries:
            self.tokens += tokens
        self._learn_text(since)
        self._restart_window()

    def _remember(self, gram: list[int]) -> None:
        entries = self.pool.setdefault(gram[0], deque(maxlen=POOL_PER_TOKEN))
        tail = tuple(gram[1:])
        if tail in entries:
            entries.remove(tail)
        entries.appendleft(tail)

    def propose(self, root: int) -> Draft:
        cfg = self.config
        w, levels = cfg.window_size, self.config.ngram_size - 1
        nodes: list[_Node] = []
        children: dict[tuple[int, int], int] = {}

        def add(parent: int, token: int, kind: str) -> int:
            key = (parent, token)
            if key not in children:
                depth = nodes[parent].depth + 1 if parent >= 0 else 1
                children[key] = len(nodes)
                nodes.append(_Node(token, parent, (kind,), 1.0, depth))
            return children[key]

        slot_of: dict[tuple[int, int], int] = {(0, 0): -1}  # candidate index per window slot (-1: the root)
        for i in range(1, w):  # level 0: a chain from the root
            slot_of[(0, i)] = add(slot_of[(0, i - 1)], int(self.levels[0, i]), LOOKAHEAD)
        for i in range(w):  # each column hangs below its level-0 slot
            for j in range(1, levels):
                slot_of[(j, i)] = add(slot_of[(j - 1, i)], int(self.levels[j, i]), LOOKAHEAD)
        for gram in list(self.pool.get(int(root), ()))[:cfg.verification_set_size]:
            parent = -1
            for token in gram:
                parent = add(parent, token, VERIFY)
        tree, order = _tree_of(nodes, list(range(len(nodes))))
        slot = {candidate: k + 1 for k, candidate in enumerate(order)}
        self._slot_of = {pos: (slot[c] if c >= 0 else 0) for pos, c in slot_of.items()}
        tokens = np.array([root, *(nodes[c].token for c in order)], dtype=np.int64)
        self._draft = Draft(tree, tokens)
        return self._draft

    def observe(self, verify, accepted) -> None:
        self.tokens += [int(t) for t in accepted.tokens]
        cfg, draft = self.config, self._draft
        w, last = cfg.window_size, cfg.ngram_size - 2
        guess = verify.logits.argmax(axis=-1)  # the target's next token after every slot
        tokens = draft.tokens
        for i in range(w):  # each column's n-gram: its guesses, then the target's next after the last
            column = [int(tokens[self._slot_of[(j, i)]]) for j in range(last + 1)]
            self._remember(column + [int(guess[self._slot_of[(last, i)]])])
        for i in range(w):  # the window moves on one Jacobi iteration
            new_last = int(guess[self._slot_of[(last, i)]])
            self.levels[:last, i] = self.levels[1:, i]
            self.levels[last, i] = new_last
