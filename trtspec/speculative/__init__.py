"""Speculative decoding maths shared by every backend: trees, sampling and acceptance rules, proposers."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "GenerationConfig": "trtspec.speculative.loop", "SamplingParams": "trtspec.speculative.sampling",
    "Penalties": "trtspec.speculative.penalties",
    "RULES": "trtspec.speculative.sampling", "LookaheadConfig": "trtspec.speculative.lookahead_proposer",
    "Datastore": "trtspec.speculative.datastore", "Method": "trtspec.speculative.method",
    "DynamicTree": "trtspec.speculative.tree", "build_tree": "trtspec.speculative.tree",
    "parse_choices": "trtspec.speculative.tree", "draw_tree": "trtspec.speculative.tree_plot",
    "tree_preset": "trtspec.speculative.tree_presets:preset",
})
