"""The Medusa paper's tree construction (Cai et al. 2024, "Medusa", sec. 3.3.3 / appendix: sparse tree by greedy
expected acceptance), on accuracies measured on calibration prompts.

Head h's top-i accuracy a[h][i] is the share of positions where its i-th candidate is the true token h + 2 ahead.
A node is a path of ranks (i_1, ..., i_d); assuming the heads independent, it is accepted with probability
prod_k a[k-1][i_k], and a tree's expected acceptance length is 1 + the sum over its nodes. Greedily adding the node
of highest probability whose parent is in the tree maximises that sum for every node budget when each head's
accuracy falls with the rank (it then adds nodes in order of decreasing probability, parents first).
"""

from __future__ import annotations

import heapq

import numpy as np


def head_accuracies(head_ranks: list[np.ndarray], max_rank: int) -> list[list[float]]:
    """a[h][i]: the share of positions (with a true token for head h) where head h ranked it i-th, i < max_rank.

    `head_ranks`: per recording [T, heads] ranks (max_rank or more: not among the candidates kept)."""
    heads = head_ranks[0].shape[1]
    out = []
    for h in range(heads):
        # positions j with a token h + 1 after them in the recording: the last h + 1 rows have none
        ranks = np.concatenate([r[:max(0, len(r) - 1 - h), h] for r in head_ranks])
        out.append([float(np.mean(ranks == i)) if ranks.size else 0.0 for i in range(max_rank)])
    return out


def greedy_tree(accuracies: list[list[float]], budget: int) -> tuple[list[list[int]], float]:
    """The tree of `budget` nodes (rank paths, parents first) with the greatest expected acceptance length under
    the independence assumption (module docstring), and that length."""
    depth, ranks = len(accuracies), len(accuracies[0]) if accuracies else 0
    chosen: list[list[int]] = []
    expected = 1.0
    heap = [(-accuracies[0][0], (0,), 1.0)] if depth and ranks else []  # (-probability, path, parent's)
    while heap and len(chosen) < budget:
        neg_p, path, parent_p = heapq.heappop(heap)
        p = -neg_p
        if p <= 0:
            break
        chosen.append(list(path))
        expected += p
        level = len(path) - 1
        if path[-1] + 1 < ranks:  # the next sibling
            heapq.heappush(heap, (-parent_p * accuracies[level][path[-1] + 1], path[:-1] + (path[-1] + 1,), parent_p))
        if len(path) < depth:  # the first child
            heapq.heappush(heap, (-p * accuracies[level + 1][0], path + (0,), p))
    return chosen, expected


def expected_length(accuracies: list[list[float]], choices: list[list[int]]) -> float:
    """A tree's expected acceptance length under the same model (for a shipped tree, beside the greedy ones)."""
    total = 1.0
    for path in choices:
        p = 1.0
        for depth, rank in enumerate(path):
            p *= accuracies[depth][rank] if depth < len(accuracies) and rank < len(accuracies[depth]) else 0.0
        total += p
    return total
