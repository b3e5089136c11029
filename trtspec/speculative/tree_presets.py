"""Named draft trees: the published Medusa / EAGLE-1 defaults and small trees for CPU runs."""

from __future__ import annotations

import copy

from trtspec.errors import ConfigError

TREE_PRESETS: dict[str, list[list[int]]] = {
    # FasterDecoding/Medusa medusa/model/medusa_choices.py, in its published order: 63 nodes, depth 4,
    # 10/28/23/2 nodes per level. Also TensorRT-LLM's default for both Medusa and EAGLE-1.
    "mc_sim_7b_63": [
        [0], [0, 0], [1], [0, 1], [2], [0, 0, 0], [1, 0], [0, 2], [3], [0, 3], [4], [0, 4], [2, 0], [0, 5],
        [0, 0, 1], [5], [0, 6], [6], [0, 7], [0, 1, 0], [1, 1], [7], [0, 8], [0, 0, 2], [3, 0], [0, 9], [8],
        [9], [1, 0, 0], [0, 2, 0], [1, 2], [0, 0, 3], [4, 0], [2, 1], [0, 0, 4], [0, 0, 5], [0, 0, 0, 0],
        [0, 1, 1], [0, 0, 6], [0, 3, 0], [5, 0], [1, 3], [0, 0, 7], [0, 0, 8], [0, 0, 9], [6, 0], [0, 4, 0],
        [1, 4], [7, 0], [0, 1, 2], [2, 0, 0], [3, 1], [2, 2], [8, 0], [0, 5, 0], [1, 5], [1, 0, 1], [0, 2, 1],
        [9, 0], [0, 6, 0], [0, 0, 0, 1], [1, 6], [0, 7, 0],
    ],
    # Name clash: the EAGLE repository's eagle/model/choices.py also calls this tree `mc_sim_7b_63`, but it
    # is a different 25-node, depth-5 tree (4/8/8/3/2 nodes per level) used by EAGLE-1 for every model.
    # TensorRT-LLM's EAGLE default is Medusa's 63-node tree above, hence the distinct name here.
    "eagle_25": [
        [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0], [0, 0, 0],
        [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0], [0, 0, 0, 0],
        [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
    ],
    "chain_2": [[0], [0, 0]],
    "chain_3": [[0], [0, 0], [0, 0, 0]],
    "chain_4": [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]],
    # 8 nodes, depth 3: the top-1 chain plus the runner-up at each of the first two levels, the shape the
    # greedy Medusa tree search grows first when top-1 accuracy dominates.
    "medusa_small_8": [[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1]],
}


def preset(name: str) -> list[list[int]]:
    """Return a copy of the named preset's choices."""
    if name not in TREE_PRESETS:
        raise ConfigError(f"unknown tree preset {name!r}; valid presets: {', '.join(TREE_PRESETS)}")
    return copy.deepcopy(TREE_PRESETS[name])
