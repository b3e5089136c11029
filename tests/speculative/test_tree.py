"""Tree buffers against TensorRT-LLM's golden values, structural properties of random trees, and every error."""

from __future__ import annotations

import json

import numpy as np
import pytest

from trtspec.errors import ConfigError
from trtspec.speculative.tree import (MAX_DEPTH, Tree, build_tree, chain_tree, expand_choices, pack_mask,
                               parse_choices)
from trtspec.speculative.tree_presets import TREE_PRESETS, preset

# ---- golden values: TensorRT-LLM cpp/tests/unit_tests/runtime/medusaModuleTest.cpp ("generated with python") ----

SIMPLE_CHOICES = [[0], [0, 1], [0, 0], [0, 2], [1, 0, 0], [1, 0, 1], [0, 0, 0], [1], [1, 0], [1, 1]]
SIMPLE_GOLDEN = {
    "topks": [2, 3, 2],
    "position_offsets": [0, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3],
    "tree_ids": [0, 1, 2, 3, 4, 2, 3, 5, 5, 6],
    "paths": [[0, 1, 3, 8], [0, 1, 4, -1], [0, 1, 5, -1], [0, 2, 6, 9], [0, 2, 6, 10], [0, 2, 7, -1]],
    "packed_mask": [[1], [3], [5], [11], [19], [35], [69], [133], [267], [581], [1093]],
}

MC_SIM_GOLDEN = {
    "topks": [10, 10, 10, 2],
    "position_offsets": [0] + [1] * 10 + [2] * 28 + [3] * 23 + [4] * 2,
    "tree_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 10, 11, 12, 13, 14, 15,
                 16, 10, 11, 12, 10, 11, 10, 10, 10, 10, 10, 10, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 20, 21,
                 22, 20, 21, 20, 20, 20, 20, 20, 20, 21, 20, 30, 31],
    "paths": [
        [0, 1, 11, 39, 62], [0, 1, 11, 39, 63], [0, 1, 11, 40, -1], [0, 1, 11, 41, -1], [0, 1, 11, 42, -1],
        [0, 1, 11, 43, -1], [0, 1, 11, 44, -1], [0, 1, 11, 45, -1], [0, 1, 11, 46, -1], [0, 1, 11, 47, -1],
        [0, 1, 11, 48, -1], [0, 1, 12, 49, -1], [0, 1, 12, 50, -1], [0, 1, 12, 51, -1], [0, 1, 13, 52, -1],
        [0, 1, 13, 53, -1], [0, 1, 14, 54, -1], [0, 1, 15, 55, -1], [0, 1, 16, 56, -1], [0, 1, 17, 57, -1],
        [0, 1, 18, 58, -1], [0, 1, 19, -1, -1], [0, 1, 20, -1, -1], [0, 2, 21, 59, -1], [0, 2, 21, 60, -1],
        [0, 2, 22, -1, -1], [0, 2, 23, -1, -1], [0, 2, 24, -1, -1], [0, 2, 25, -1, -1], [0, 2, 26, -1, -1],
        [0, 2, 27, -1, -1], [0, 3, 28, 61, -1], [0, 3, 29, -1, -1], [0, 3, 30, -1, -1], [0, 4, 31, -1, -1],
        [0, 4, 32, -1, -1], [0, 5, 33, -1, -1], [0, 6, 34, -1, -1], [0, 7, 35, -1, -1], [0, 8, 36, -1, -1],
        [0, 9, 37, -1, -1], [0, 10, 38, -1, -1],
    ],
    "packed_mask": [
        [1, 0], [3, 0], [5, 0], [9, 0], [17, 0], [33, 0], [65, 0], [129, 0], [257, 0], [513, 0], [1025, 0],
        [2051, 0], [4099, 0], [8195, 0], [16387, 0], [32771, 0], [65539, 0], [131075, 0], [262147, 0],
        [524291, 0], [1048579, 0], [2097157, 0], [4194309, 0], [8388613, 0], [16777221, 0], [33554437, 0],
        [67108869, 0], [134217733, 0], [268435465, 0], [536870921, 0], [1073741833, 0], [-2147483631, 0],
        [17, 1], [33, 2], [65, 4], [129, 8], [257, 16], [513, 32], [1025, 64], [2051, 128], [2051, 256],
        [2051, 512], [2051, 1024], [2051, 2048], [2051, 4096], [2051, 8192], [2051, 16384], [2051, 32768],
        [2051, 65536], [4099, 131072], [4099, 262144], [4099, 524288], [8195, 1048576], [8195, 2097152],
        [16387, 4194304], [32771, 8388608], [65539, 16777216], [131075, 33554432], [262147, 67108864],
        [2097157, 134217728], [2097157, 268435456], [268435465, 536870912], [2051, 1073741952],
        [2051, -2147483520],
    ],
}


@pytest.mark.parametrize(("choices", "golden"), [(SIMPLE_CHOICES, SIMPLE_GOLDEN),
                                                 (TREE_PRESETS["mc_sim_7b_63"], MC_SIM_GOLDEN)],
                         ids=["simpleChoices", "mcSim7663Choices"])
def test_matches_trtllm_golden_arrays(choices, golden):
    tree = build_tree(choices)
    assert list(tree.topks) == golden["topks"]
    assert tree.position_offsets.tolist() == golden["position_offsets"]
    assert tree.tree_ids.tolist() == golden["tree_ids"]
    assert tree.paths.tolist() == golden["paths"]
    assert tree.packed_mask.tolist() == golden["packed_mask"]
    assert tree.packed_mask.dtype == np.int32


def test_mc_sim_7b_63_shape_facts():
    tree = build_tree(preset("mc_sim_7b_63"))
    assert (tree.num_nodes, tree.depth, tree.nodes_per_level()) == (63, 4, (10, 28, 23, 2))
    assert tree.paths.shape == (42, 5) and tree.num_leaves == 42
    assert tree.paths[:3].tolist() == [[0, 1, 11, 39, 62], [0, 1, 11, 39, 63], [0, 1, 11, 40, -1]]
    assert tree.packed_mask.shape == (64, 2)
    assert tree.packed_mask[-1].tolist() == [2051, -2147483520]
    assert max(tree.non_leaves_per_level()) == 10  # why the README's max_non_leaves_per_layer minimum is 10
    assert tree.non_leaves_per_level() == (1, 10, 10, 1)


def test_nine_node_tree_packed_rows():
    tree = build_tree([[0], [0, 0], [0, 0, 0], [0, 0, 0, 0], [0, 1], [0, 1, 0], [1], [1, 0], [1, 1]])
    assert tree.packed_mask[:, 0].tolist() == [1, 3, 5, 11, 19, 37, 69, 139, 275, 651]


def test_eagle_25_preset_is_a_depth_5_tree():
    tree = build_tree(preset("eagle_25"), exact_depth=5)
    assert (tree.num_nodes, tree.depth, tree.nodes_per_level(), tree.num_leaves) == (25, 5, (4, 8, 8, 3, 2), 15)


@pytest.mark.parametrize("name", sorted(TREE_PRESETS))
def test_presets_are_valid_and_small_ones_fit_cpu_limits(name):
    tree = build_tree(preset(name), num_heads=5, max_draft_len=63, max_non_leaves_per_layer=10)
    assert tree.num_nodes == len(TREE_PRESETS[name])
    if name.startswith(("chain_", "medusa_small")):
        assert tree.num_nodes <= 8 and tree.depth <= 4
    if name.startswith("chain_"):
        assert tree == chain_tree(int(name.split("_")[1]))


def test_preset_returns_a_copy():
    preset("chain_2").append([7])
    assert TREE_PRESETS["chain_2"] == [[0], [0, 0]]


# ---- the node order, the small accessors, JSON -------------------------------------------------------------

def test_nodes_sorted_by_length_then_lexicographic():
    tree = build_tree([[1, 0], [0], [1], [0, 2], [0, 0]])
    assert tree.choices == ((0,), (1,), (0, 0), (0, 2), (1, 0))
    assert tree.parents.tolist() == [-1, 0, 0, 1, 1, 2]
    assert tree.ranks.tolist() == [0, 0, 1, 0, 2, 0]
    assert tree.children == ((1, 2), (3, 4), (5,), (), (), ())
    assert tree.topks == (2, 3)
    assert tree.tree_ids.tolist() == [0, 1, 2, 4, 2]  # sum(topks[:depth-1]) + rank


def test_chain_tree():
    tree = chain_tree(3)
    assert tree.choices == ((0,), (0, 0), (0, 0, 0))
    assert tree.paths.tolist() == [[0, 1, 2, 3]]
    assert tree.packed_mask[:, 0].tolist() == [1, 3, 7, 15]
    assert (tree.topks, tree.tree_ids.tolist()) == ((1, 1, 1), [0, 1, 2])
    assert chain_tree(MAX_DEPTH + 4).depth == MAX_DEPTH + 4  # a draft-model chain is not bound by the choice limits


def test_empty_tree_is_the_root_alone():
    for tree in (chain_tree(0), build_tree([])):
        assert (tree.num_nodes, tree.depth, tree.topks) == (0, 0, ())
        assert tree.paths.tolist() == [[0]]  # accepting nothing still emits the bonus token
        assert tree.mask.tolist() == [[True]] and tree.packed_mask.tolist() == [[1]]
        assert tree.tree_ids.shape == (0,) and tree.non_leaves_per_level() == ()


def test_to_json_dict_is_exactly_the_seven_buffers():
    data = build_tree(SIMPLE_CHOICES).to_json_dict()
    assert set(data) == {"num_nodes", "topks", "position_offsets", "tree_ids", "paths", "mask", "packed_mask"}
    assert json.loads(json.dumps(data)) == data
    assert data["mask"][3] == [1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    assert data["packed_mask"] == SIMPLE_GOLDEN["packed_mask"]


def test_tree_is_immutable_and_compares_by_choices():
    tree = build_tree(SIMPLE_CHOICES)
    with pytest.raises(ValueError):
        tree.mask[0, 1] = True
    assert tree == build_tree(list(reversed(SIMPLE_CHOICES))) and hash(tree) == hash(build_tree(SIMPLE_CHOICES))
    assert tree != chain_tree(3)


# ---- packing ------------------------------------------------------------------------------------------------

def test_pack_mask_bits_words_and_sign():
    mask = np.zeros((2, 40), dtype=bool)
    mask[0, [0, 31]] = True
    mask[1, [32, 39]] = True
    assert pack_mask(mask).tolist() == [[1 - 2**31, 0], [0, 1 + 2**7]]
    assert pack_mask(mask, 3).tolist() == [[1 - 2**31, 0, 0], [0, 1 + 2**7, 0]]


def test_packed_mask_words_pads_for_a_static_k_profile():
    tree = build_tree(SIMPLE_CHOICES)
    padded = tree.packed_mask_words(3)  # e.g. K = 95: ceil(96 / 32) words
    assert padded.shape == (11, 3) and padded.dtype == np.int32
    assert padded[:, 0].tolist() == tree.packed_mask[:, 0].tolist() and not padded[:, 1:].any()
    with pytest.raises(ConfigError, match=r"64 columns needs at least 2 packed int32 words per row, got 1"):
        build_tree(preset("mc_sim_7b_63")).packed_mask_words(1)


# ---- random trees: the buffers agree with each other ----------------------------------------------------------

def random_choices(rng: np.random.Generator, num_nodes: int, max_depth: int, max_rank: int) -> list[list[int]]:
    """Grow a tree by giving random nodes their next-ranked child; return its choices shuffled."""
    nodes, next_rank = [()], {(): 0}
    while len(nodes) < num_nodes + 1:
        parent = nodes[rng.integers(len(nodes))]
        if len(parent) < max_depth and next_rank[parent] <= max_rank:
            child = parent + (next_rank[parent],)
            next_rank[parent] += 1
            next_rank[child] = 0
            nodes.append(child)
    return [list(nodes[i]) for i in rng.permutation(np.arange(1, len(nodes)))]


def unpack(packed: np.ndarray, cols: int) -> np.ndarray:
    bits = (packed.astype(np.uint32)[:, :, None] >> np.arange(32, dtype=np.uint32)) & 1  # [rows, words, 32]
    return bits.reshape(len(packed), -1)[:, :cols].astype(bool)


def check_invariants(tree: Tree) -> None:
    n = tree.num_nodes
    for i in range(n + 1):  # mask row = the node and its ancestors, found by walking parents
        chain, node = set(), i
        while node != -1:
            chain.add(node)
            node = tree.parents[node]
        assert set(np.flatnonzero(tree.mask[i])) == chain
    assert (unpack(tree.packed_mask, n + 1) == tree.mask).all()
    leaves = [i for i in range(n + 1) if not tree.children[i]]
    ends = [row[row >= 0][-1] for row in tree.paths]
    assert sorted(ends) == leaves and len(set(ends)) == len(ends)
    for row in tree.paths:
        row = row[row >= 0]
        assert row[0] == 0 and all(tree.parents[b] == a for a, b in zip(row, row[1:]))
        assert tree.position_offsets[row].tolist() == list(range(len(row)))
    for i, kids in enumerate(tree.children):
        assert all(tree.parents[k] == i for k in kids)
        assert list(tree.ranks[list(kids)]) == list(range(len(kids)))  # rank order, no gaps in these trees
    assert sum(len(k) for k in tree.children) == n
    assert (tree.packed_mask == tree.packed_mask_words(tree.packed_mask.shape[1])).all()


@pytest.mark.parametrize("seed", range(12))
def test_random_trees_are_self_consistent(seed):
    rng = np.random.default_rng(seed)
    choices = random_choices(rng, num_nodes=int(rng.integers(1, 90)), max_depth=6, max_rank=5)
    tree = build_tree(choices)
    assert tree.num_nodes == len(choices)
    check_invariants(tree)
    leaves = [list(tree.choices[row[row >= 0][-1] - 1]) for row in tree.paths if row[1] != -1]
    assert expand_choices(leaves) == [list(c) for c in tree.choices]  # paths-only round trip


def test_chain_and_preset_trees_are_self_consistent():
    for tree in (chain_tree(0), chain_tree(5), *(build_tree(c) for c in TREE_PRESETS.values())):
        check_invariants(tree)


# ---- expansion and parsing -------------------------------------------------------------------------------------

def test_paths_only_mc_sim_expands_to_the_full_list():
    full = preset("mc_sim_7b_63")
    tree = build_tree(full)
    leaves = [list(tree.choices[row[row >= 0][-1] - 1]) for row in tree.paths]
    assert len(leaves) == 42
    assert sorted(expand_choices(leaves)) == sorted(full)
    assert build_tree(leaves) == tree


def test_vanilla_list_is_returned_unchanged():
    assert expand_choices([[1], [0], [0, 0]]) == [[1], [0], [0, 0]]
    assert expand_choices([(0, 1), (2,)]) == [[0], [2], [0, 1]]  # [0] missing: paths-only, expanded and sorted


@pytest.mark.parametrize("text", ["[[0], [0, 1], [1]]", "{{0}, {0, 1}, {1}}", "[(0,), (0, 1), (1,)]",
                                  " {{0},{0,1},{1}} ", "[[0],[0,1],[1],]"])
def test_parse_choices_syntaxes(text):
    assert parse_choices(text) == [[0], [0, 1], [1]]


@pytest.mark.parametrize(("text", "message"), [
    ("[[0", "cannot parse tree choices '[[0'; write them as JSON"),
    ("0", "tree choices must be a list, got int"),
    ("[[0], 1]", "tree choice 1 is not a list"),
    ("hello", "cannot parse tree choices"),
])
def test_parse_choices_errors(text, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        parse_choices(text)


# ---- one table: what builds, and what is refused with which message ----------------------------------------------

BUILD_TABLE = [
    # (id, choices, keyword limits, num_nodes when valid | message substrings when refused)
    ("full", SIMPLE_CHOICES, {}, 10),
    ("paths-only", [[0, 0, 1], [1, 2]], {}, 5),
    ("paths-only with a first-level leaf", [[0], [1, 0]], {}, 3),
    ("empty", [], {}, 0),
    ("tuples", [(0,), (0, 0)], {}, 2),
    ("rank 16 is the limit", [[16]], {}, 1),
    ("depth 16 is the limit", [[0] * d for d in range(1, 17)], {}, 16),
    ("heads exactly enough", preset("mc_sim_7b_63"), {"num_heads": 4, "max_draft_len": 63,
                                                       "max_non_leaves_per_layer": 10}, 63),
    ("eagle exact depth", preset("eagle_25"), {"exact_depth": 5}, 25),
    ("not a list", "[[0]]", {}, ("tree choices must be a list, got str", "e.g. [[0], [0, 0], [1]]")),
    ("choice not a list", [[0], 1], {}, ("tree choice 1 is not a list",)),
    ("empty choice", [[0], []], {}, ("tree choice [] is empty", "root is implicit")),
    ("negative", [[0], [0, -1]], {}, ("tree choice [0, -1] holds -1", "non-negative ints")),
    ("float", [[0.0]], {}, ("holds 0.0", "non-negative ints")),
    ("bool", [[True]], {}, ("holds True",)),
    ("duplicate", [[0], [1], [0]], {}, ("tree choice [0] is listed twice", "remove the duplicate")),
    ("missing parent", [[0], [0, 0], [1, 0]], {}, ("tree choice [1, 0] needs its parent [1]", "add it")),
    ("missing middle", [[0], [0, 0, 1]], {}, ("tree choice [0, 0, 1] needs its parent [0, 0]",)),
    ("rank above 16", [[0], [0, 17]], {}, ("tree choice [0, 17] has rank 17", "limit of 16 per level")),
    ("depth above 16", [[0] * 17], {}, ("has depth 17", "limit of 16 levels", "shorten it")),
    ("too few heads", preset("eagle_25"), {"num_heads": 4},
     ("tree depth 5 exceeds the 4 Medusa heads", "--num-heads >= 5")),
    ("K too small", preset("mc_sim_7b_63"), {"max_draft_len": 32},
     ("63 tree nodes need --max-draft-len >= 63 (got 32)",)),
    ("too many non-leaves", preset("mc_sim_7b_63"), {"max_non_leaves_per_layer": 8},
     ("tree level 1 has 10 non-leaf nodes", "--max-non-leaves-per-layer 8", ">= 10")),
    ("eagle depth mismatch", preset("mc_sim_7b_63"), {"exact_depth": 5},
     ("EAGLE-1 needs tree depth == num_eagle_layers = 5", "has depth 4", "--num-eagle-layers 4")),
]


@pytest.mark.parametrize(("choices", "limits", "outcome"), [row[1:] for row in BUILD_TABLE],
                         ids=[row[0] for row in BUILD_TABLE])
def test_build_table(choices, limits, outcome):
    if isinstance(outcome, int):
        assert build_tree(choices, **limits).num_nodes == outcome
        return
    with pytest.raises(ConfigError) as caught:
        build_tree(choices, **limits)
    message = str(caught.value)
    assert "\n" not in message
    for part in outcome:
        assert part in message


def test_unknown_preset_lists_the_valid_names():
    with pytest.raises(ConfigError, match="unknown tree preset 'nope'; valid presets: mc_sim_7b_63, eagle_25"):
        preset("nope")


@pytest.mark.parametrize("length", [-1, 1.5, True])
def test_chain_tree_rejects_bad_lengths(length):
    with pytest.raises(ConfigError, match="chain length must be a non-negative int"):
        chain_tree(length)
