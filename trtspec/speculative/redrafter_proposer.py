"""ReDrafter drafting (Apple's recurrent drafter, arXiv 2403.09919; TensorRT-LLM's explicit_draft_tokens mode).

From the base's final hidden state at the last accepted position and the token it chose (the root), a beam search
of `num_beams` beams, `draft_len` tokens deep, runs the engine's drafter one step per depth over every beam at once
(`Engine.redrafter_step`): each beam's last token enters the drafter's recurrence, the drafter scores the next token,
and the `num_beams` best continuations of all beams by summed log-probability survive (TensorRT-LLM
redrafter_helper.py `_beam_search_candidates`: the beams start as the root alone, at scores 0, -50000, ...). The
beams share prefixes; merged into one tree (each shared prefix once, as `_beams2tree` packs them) they are verified in
one step. Acceptance is the loop's: the longest accepted path of the tree at T = 0 (the beam with the most accepted
tokens, as upstream's greedy validation picks it), lossless tree rejection sampling at T > 0.
"""

from __future__ import annotations

import numpy as np

from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.engine import Engine, StepOutput
from trtspec.speculative.proposer import Draft, log_softmax
from trtspec.speculative.tree import Tree, tree_from_choices

FIRST_BEAM_ONLY = -50000.0  # the score every beam but the first starts at: step one expands the root once


class ReDrafterProposer:
    def __init__(self, num_beams: int, draft_len: int):
        self.num_beams, self.draft_len = num_beams, draft_len
        self.engine: Engine | None = None
        self._hidden: np.ndarray | None = None  # [H] at the last accepted position

    @property
    def max_nodes(self) -> int:
        return self.num_beams * self.draft_len

    def start(self, engine: Engine, seq, prefill: StepOutput, prompt_ids, root) -> None:
        self.engine = engine
        self._hidden = np.array(prefill.hidden[-1], dtype=np.float32, copy=True)

    def propose(self, root: int) -> Draft:
        beams, probs = beam_search(self.engine, self._hidden, root, self.num_beams, self.draft_len)
        tree, tokens, confidence = beams_to_tree(beams, probs)
        return Draft(tree, tokens, confidence=confidence)

    def observe(self, verify: StepOutput, accepted: Accepted) -> None:
        self._hidden = np.array(verify.hidden[accepted.last_slot], dtype=np.float32, copy=True)

    # deferred observation (back-off while resting): only the last step's hidden state matters
    @staticmethod
    def defer(verify: StepOutput, accepted: Accepted):
        return np.array(verify.hidden[accepted.last_slot], dtype=np.float32, copy=True)

    def start_deferred(self, engine: Engine, seq, prefill: StepOutput, prompt_ids, root):
        self.engine = engine
        return np.array(prefill.hidden[-1], dtype=np.float32, copy=True)

    def catch_up(self, entries: list) -> None:
        self._hidden = entries[-1]


def beam_search(engine: Engine, hidden: np.ndarray, root: int, num_beams: int,
                draft_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The beams [num_beams, draft_len + 1] (root first), best first, and the drafter's probability of each beam's
    token at each depth given its prefix [num_beams, draft_len]."""
    H = hidden.shape[-1]
    rows = np.broadcast_to(hidden.astype(np.float32), (num_beams, H)).copy()
    scores = np.full(num_beams, FIRST_BEAM_ONLY, np.float32)
    scores[0] = 0.0
    beams = np.full((num_beams, 1), root, np.int64)
    probs = np.zeros((num_beams, 0), np.float64)
    state = np.zeros((num_beams, H), np.float32)
    has_state = np.zeros((num_beams, 1), np.float32)
    for depth in range(draft_len):
        if depth == 0:  # every beam is the root alone: one row scores it, the others are copies
            logits, state = engine.redrafter_step(rows[:1], beams[:1, -1], state[:1], has_state[:1])
            logits, state = np.repeat(logits, num_beams, axis=0), np.repeat(state, num_beams, axis=0)
        else:
            logits, state = engine.redrafter_step(rows, beams[:, -1], state, has_state)
        log_probs = log_softmax(logits, np.float32)  # [nb, V]
        total = (log_probs + scores[:, None]).ravel()
        top = np.argpartition(-total, num_beams - 1)[:num_beams]
        top = top[np.argsort(-total[top], kind="stable")]
        parent, token = np.divmod(top, log_probs.shape[1])
        beams = np.concatenate([beams[parent], token[:, None]], axis=1)
        probs = np.concatenate([probs[parent], np.exp(log_probs[parent, token].astype(np.float64))[:, None]], axis=1)
        scores, state = total[top], state[parent]
        has_state = np.ones_like(has_state)
    return beams, probs


def beams_to_tree(beams: np.ndarray, probs: np.ndarray) -> tuple[Tree, np.ndarray, np.ndarray]:
    """The beams' continuations (beams[:, 1:]) as one tree, each shared prefix a single node: (tree, tokens [n + 1]
    with the root first, each node's drafter probability [n]). A node's rank among its siblings is the order in
    which the beams, best first, reach it."""
    choice_of: dict[tuple[int, ...], tuple[int, ...]] = {(): ()}  # token prefix → tree choice
    children: dict[tuple[int, ...], int] = {}
    prob_of: dict[tuple[int, ...], float] = {}
    for beam, beam_probs in zip(beams[:, 1:].tolist(), probs.tolist()):
        for depth in range(len(beam)):
            prefix = tuple(beam[:depth + 1])
            if prefix in choice_of:
                continue
            parent = prefix[:-1]
            rank = children.get(parent, 0)
            children[parent] = rank + 1
            choice_of[prefix] = (*choice_of[parent], rank)
            prob_of[prefix] = beam_probs[depth]
    by_choice = {choice: prefix for prefix, choice in choice_of.items() if prefix}
    tree = tree_from_choices(tuple(sorted(by_choice, key=lambda c: (len(c), c))))
    prefixes = [by_choice[c] for c in tree.choices]
    tokens = np.array([int(beams[0, 0])] + [p[-1] for p in prefixes], dtype=np.int64)
    return tree, tokens, np.array([prob_of[p] for p in prefixes], dtype=np.float64)

