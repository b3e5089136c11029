"""Speculative methods by name, each a proposer checked against what the engine was built with."""

from __future__ import annotations

from trtspec.errors import ConfigError
from trtspec.runtime.engine import Engine
from trtspec.spec.eagle_proposer import DynamicTree, EagleProposer
from trtspec.spec.medusa_proposer import MedusaProposer
from trtspec.spec.proposer import NoDraft, Proposer
from trtspec.spec.tree import Tree

METHODS = ("none", "medusa", "eagle", "eagle2")


def make_proposer(method: str, engine: Engine, *, tree: Tree | None = None,
                  dynamic: DynamicTree | None = None) -> Proposer:
    """A fresh proposer for one sequence; `tree` for medusa / eagle (EAGLE-1), `dynamic` for eagle2."""
    if method not in METHODS:
        raise ConfigError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
    if method == "none":
        return NoDraft()
    size = _need(dynamic, method).total_tokens if method == "eagle2" else _need(tree, method).num_nodes
    if size > engine.max_draft_len:
        raise ConfigError(f"{method} drafts {size} tokens per step but the engine's max_draft_len is "
                          f"{engine.max_draft_len}; rebuild with --max-draft-len {size} or use a smaller tree")
    if method == "medusa":
        if not engine.num_medusa_heads:
            raise ConfigError("method medusa needs an engine built from a Medusa checkpoint (it has no heads)")
        return MedusaProposer(tree, engine.num_medusa_heads)
    if not engine.has_eagle_draft:
        raise ConfigError(f"method {method} needs an engine built from an EAGLE checkpoint (it has no draft)")
    return EagleProposer(tree) if method == "eagle" else EagleProposer(dynamic=dynamic)


def _need(value, method: str):
    if value is None:
        raise ConfigError(f"method {method} needs a {'dynamic tree' if method == 'eagle2' else 'tree'}")
    return value
