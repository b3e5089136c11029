"""Speculative methods by name, each a proposer checked against what the engine was built with."""

from __future__ import annotations

from trtspec.errors import ConfigError
from trtspec.speculative.backoff import Backoff
from trtspec.speculative.engine import CostedEngine, Engine
from trtspec.speculative.eagle_proposer import EagleProposer
from trtspec.speculative.tree import DynamicTree
from trtspec.speculative.lookahead_proposer import LookaheadConfig, LookaheadProposer
from trtspec.speculative.medusa_proposer import MedusaProposer
from trtspec.speculative.method import METHODS, TRAINED, TRAINING_FREE, Method  # noqa: F401 (re-exported)
from trtspec.speculative.datastore import Datastore, RecentOutputs
from trtspec.speculative.ngram_proposer import SUFFIX_CORPUS, SUFFIX_RECENT, AcceptanceModel, NgramConfig, NgramProposer
from trtspec.speculative.proposer import NoDraft, Proposer
from trtspec.speculative.step_costs import StepCosts
from trtspec.speculative.tree import Tree, chain_tree

# lookahead's (W, N, G) when neither the request nor the engine names one: the largest of these that fits K
LOOKAHEAD_DEFAULTS = ((4, 3, 4), (3, 3, 3), (2, 3, 2), (2, 2, 2), (2, 2, 1))
HYBRID = Method.HYBRID.value


def runnable_methods(own: str, max_draft_len: int, *, chains_only: bool = False) -> tuple[str, ...]:
    """The methods a CPU engine built for `own` with K = `max_draft_len` runs, in METHODS order (`chains_only`: an
    engine that verifies chains only exactly, where lookahead's tree of Jacobi columns cannot run)."""
    ok = {"none", own}
    if max_draft_len >= 1:
        ok |= {"ngram", "suffix"}
    if max_draft_len >= 2 and not chains_only:
        ok.add("lookahead")
    if own in (Method.MEDUSA.value, Method.EAGLE.value, Method.EAGLE2.value):  # the drafters hybrid merges with
        ok.add(HYBRID)
    return tuple(m for m in METHODS if m in ok)


def make_proposer(method: str, engine: Engine, *, tree: Tree | None = None, dynamic: DynamicTree | None = None,
                  ngram: NgramConfig | None = None, acceptance: AcceptanceModel | None = None,
                  datastore: Datastore | None = None, recent: RecentOutputs | None = None,
                  lookahead: LookaheadConfig | None = None, backoff: bool = True) -> Proposer:
    """A fresh proposer for one sequence; `tree` for medusa / eagle (EAGLE-1), `dynamic` for eagle2, `ngram` (and
    an `acceptance` model shared across sequences) for ngram and suffix; suffix also looks up the shared `recent`
    outputs and the `datastore` corpus (either may be None); lookahead runs `lookahead`'s (W, N, G) (default: the
    engine's, else the largest of LOOKAHEAD_DEFAULTS that fits its K); hybrid merges the engine's own drafter (`tree` or
    `dynamic` as for it) with suffix's candidates.

    redrafter runs the engine's beam search (its manifest's beams and draft length). Medusa, EAGLE, ReDrafter and
    lookahead drafts are shrunk to what the engine's verify curve says pays, and rest while nothing
    does (`backoff.Backoff`; `backoff=False`: the drafter's full tree every step, as TensorRT-LLM drafts);
    ngram, suffix and hybrid budget their drafts themselves.

    On an engine that verifies chains only exactly (`Engine.chains_only`) every method drafts a chain: Medusa and
    EAGLE-1 the top-1 path as deep as their tree, EAGLE-2 its top-1 path `depth` deep, ngram / suffix / hybrid their
    most probable path; lookahead, whose Jacobi columns are a tree by construction, is refused."""
    Method.expect(method, Method.decoded_on_cpu(), "method")
    if method == "none":
        return NoDraft()
    if chains_only(engine):
        if method == "lookahead":
            raise ConfigError("method lookahead verifies a tree of Jacobi guesses, and this engine (quantized weights) "
                              "computes only chains exactly like plain steps; use ngram or suffix")
        tree = chain_tree(tree.depth) if tree is not None else None
        dynamic = DynamicTree(depth=dynamic.depth, top_k=1, total_tokens=dynamic.depth) if dynamic else None
    if method in TRAINING_FREE:
        if engine.max_draft_len < 1:
            raise ConfigError(f"method {method} needs an engine built with --max-draft-len K >= 1 (this one has "
                              "K = 0)")
        if method == "lookahead":
            return _backed_off(LookaheadProposer(lookahead_config(engine, lookahead)), engine, backoff)
        sources = ()
        if method == "suffix":
            sources = tuple((kind, source) for kind, source in ((SUFFIX_RECENT, recent), (SUFFIX_CORPUS, datastore))
                            if source is not None)
        return NgramProposer(step_costs(engine), ngram or NgramConfig(), model=acceptance,
                             max_draft_len=engine.max_draft_len, sources=sources,
                             recent=recent if method == "suffix" else None, chains=chains_only(engine))
    if method == HYBRID:
        own = "medusa" if engine.num_medusa_heads else "eagle2" if dynamic is not None else "eagle" \
            if engine.has_eagle_draft else None
        if own is None:
            raise ConfigError("method hybrid needs an engine with a trained drafter (Medusa heads or an EAGLE draft); "
                              "use ngram or suffix with this one")
        from trtspec.speculative.hybrid_proposer import HybridProposer

        drafter = make_proposer(own, engine, tree=tree, dynamic=dynamic, backoff=False)
        sources = tuple((kind, source) for kind, source in ((SUFFIX_RECENT, recent), (SUFFIX_CORPUS, datastore))
                        if source is not None)
        return HybridProposer(drafter, step_costs(engine), ngram or NgramConfig(), model=acceptance,
                              max_draft_len=engine.max_draft_len, sources=sources, recent=recent,
                              chains=chains_only(engine))
    if method == Method.REDRAFTER.value:
        return _backed_off(_redrafter(engine), engine, backoff)
    _check_trained(method, engine, tree, dynamic)
    size = dynamic.total_tokens if method == "eagle2" else tree.num_nodes
    if size > engine.max_draft_len:
        raise ConfigError(f"{method} drafts {size} tokens per step but the engine's max_draft_len is "
                          f"{engine.max_draft_len}; rebuild with --max-draft-len {size} or use a smaller tree")
    if method == "medusa":
        return _backed_off(MedusaProposer(tree, engine.num_medusa_heads), engine, backoff)
    drafter = EagleProposer(tree) if method == "eagle" else EagleProposer(dynamic=dynamic)
    return _backed_off(drafter, engine, backoff)


def _redrafter(engine: Engine) -> Proposer:
    """ReDrafter's beam search as the engine was built for it (its manifest's redrafter section)."""
    from trtspec.speculative.redrafter_proposer import ReDrafterProposer

    manifest = getattr(engine, "manifest", None)
    beams = getattr(manifest, "redrafter", None)
    if not getattr(engine, "has_redrafter", False) or not beams:
        raise ConfigError("method redrafter needs an engine built from a ReDrafter checkpoint (`trtspec convert "
                          "--redrafter DIR`, then `trtspec build`); this one has no drafter graph")
    # an engine exact on chains only: the best beam alone (upstream's beam search with one beam)
    proposer = ReDrafterProposer(1 if chains_only(engine) else beams["num_beams"], beams["draft_len_per_beam"])
    if proposer.max_nodes > engine.max_draft_len:
        raise ConfigError(f"redrafter drafts up to {proposer.max_nodes} tokens per step but the engine's max_draft_len "
                          f"is {engine.max_draft_len}")
    return proposer


def _backed_off(drafter: Proposer, engine: Engine, backoff: bool) -> Proposer:
    return Backoff(drafter, step_costs(engine)) if backoff else drafter


def chains_only(engine: Engine) -> bool:
    """Whether the engine verifies chains only exactly (an engine that does not say verifies trees exactly)."""
    return bool(getattr(engine, "chains_only", False))


def lookahead_config(engine: Engine, requested: LookaheadConfig | None) -> LookaheadConfig:
    """The (W, N, G) a lookahead request runs, checked against the engine's K and its own (W, N, G) if it has one."""
    manifest = getattr(engine, "manifest", None)
    own = LookaheadConfig(**manifest.lookahead) if manifest is not None and manifest.lookahead else None
    config = requested or default_lookahead(engine.max_draft_len, own)
    if config is None:
        raise ConfigError(f"method lookahead: the engine's max_draft_len {engine.max_draft_len} holds no lookahead "
                          "step (the smallest, (W, N, G) = 2,2,1, needs 2)")
    config.check_fits(engine.max_draft_len, own)
    return config


def default_lookahead(max_draft_len: int, own: LookaheadConfig | None = None) -> LookaheadConfig | None:
    """The engine's own (W, N, G), else the largest of LOOKAHEAD_DEFAULTS that fits K (None: none fits)."""
    return own or next((c for c in (LookaheadConfig(*d) for d in LOOKAHEAD_DEFAULTS)
                        if c.max_draft_len <= max_draft_len), None)


def check_draft_budget(budget: int | None, max_draft_len: int, flag: str = "draft budget") -> int | None:
    """A deployment's budget of draft tokens a step for the training-free drafters: 1..K (None: the engine's K)."""
    if budget is None:
        return None
    if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= max_draft_len:
        raise ConfigError(f"{flag} {budget!r}: the training-free drafters' tokens per step, 1 to the engine's "
                          f"max_draft_len {max_draft_len}")
    return budget


EAGLE2_FLAG = "--eagle2 DEPTH,TOP_K,TOTAL_TOKENS"  # `trtspec build`'s flag for EAGLE-2's dynamic tree


def _check_trained(method: str, engine: Engine, tree: Tree | None, dynamic: DynamicTree | None) -> None:
    """A trained drafter's method against what the engine was built with: its heads or draft, and the static tree
    (medusa, eagle) or the dynamic one (eagle2) it drafts; a mismatch is one line saying what to run or rebuild."""
    if method == "medusa" and not engine.num_medusa_heads:
        raise ConfigError("method medusa needs an engine built from a Medusa checkpoint (it has no heads)")
    if method in ("eagle", "eagle2") and not engine.has_eagle_draft:
        how = f" with {EAGLE2_FLAG}" if method == "eagle2" else ""
        raise ConfigError(f"method {method} needs an engine built from an EAGLE checkpoint{how} (it has no draft)")
    if method == "eagle2" and dynamic is None:
        raise ConfigError(f"method eagle2 drafts EAGLE-2's dynamic tree and this engine was built with a static "
                          f"(EAGLE-1) tree: use --method eagle, or rebuild it with `{_rebuild(engine)} {EAGLE2_FLAG}` "
                          f"(TOTAL_TOKENS at most its max_draft_len {engine.max_draft_len})")
    if method in ("medusa", "eagle") and tree is None:
        if dynamic is not None:
            raise ConfigError(f"method {method} drafts a static tree and this engine was built for EAGLE-2's dynamic "
                              f"tree (--eagle2): use --method eagle2, or rebuild it without --eagle2")
        raise ConfigError(f"method {method} needs a tree; this engine has none")


def _rebuild(engine: Engine) -> str:
    """`trtspec build CHECKPOINT --out DIR`, naming the checkpoint the engine was built from where its manifest
    says."""
    import shlex

    manifest = getattr(engine, "manifest", None)
    source = getattr(manifest, "source", "") or "CHECKPOINT"
    return f"trtspec build {source if source == 'CHECKPOINT' else shlex.quote(str(source))} --out DIR"


def step_costs(engine: Engine) -> StepCosts:
    """The engine's measured verify curve when it offers one, else the straight-line guess over its profiles."""
    if isinstance(engine, CostedEngine):
        return engine.step_costs()
    return StepCosts.linear(tuple(getattr(engine, "slot_profiles", ())) or (engine.max_draft_len + 1,))
