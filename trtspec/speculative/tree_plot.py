"""Draw a draft tree as a PNG: depth left to right, leaves top to bottom in DFS order."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.tree import Tree


def node_rows(tree: Tree) -> np.ndarray:
    """Vertical position per node: leaves take rows 0, 1, ... in path order, a parent sits at its children's mean."""
    rows = np.zeros(tree.num_nodes + 1)  # [n+1]
    for row, path in enumerate(tree.paths):
        rows[path[path >= 0][-1]] = row
    for node in range(tree.num_nodes, -1, -1):  # children have larger indices than their parents
        if tree.children[node]:
            rows[node] = rows[list(tree.children[node])].mean()
    return rows


def draw_tree(tree: Tree, path: str | Path) -> Path:
    """Write a PNG of `tree`: each node labelled `index` over `r<rank>`, edges parent → child."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # lazy: matplotlib is a dev extra
    from matplotlib.figure import Figure

    path = Path(path)
    rows = node_rows(tree)
    depths = tree.position_offsets
    fig = Figure(figsize=(1.6 + 1.4 * tree.depth, 1.0 + 0.32 * tree.num_leaves))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for node in range(1, tree.num_nodes + 1):
        parent = tree.parents[node]
        ax.plot([depths[parent], depths[node]], [rows[parent], rows[node]], color="0.6", lw=0.8, zorder=1)
    for node in range(tree.num_nodes + 1):
        label = "root" if node == 0 else f"{node}\nr{tree.ranks[node]}"
        ax.text(depths[node], rows[node], label, ha="center", va="center", fontsize=6, zorder=2,
                bbox={"boxstyle": "round,pad=0.25", "fc": "white", "ec": "0.3", "lw": 0.6})
    ax.set_xlim(-0.5, tree.depth + 0.5)
    ax.set_ylim(tree.num_leaves - 0.5, -0.5)
    ax.set_xticks(range(tree.depth + 1))
    ax.set_xlabel("depth (draft position)")
    ax.set_yticks([])
    ax.set_title(f"{tree.num_nodes} nodes, depth {tree.depth}, topks {list(tree.topks)}", fontsize=9)
    try:
        fig.savefig(path, format="png", dpi=120, bbox_inches="tight")
    except OSError as e:
        raise ConfigError(f"cannot write the tree drawing to {path}: {e.strerror or e}; "
                          f"pass a --png path in a writable folder") from None
    return path
