"""One place that turns build settings into what an engine is: its method and its tree, for both backends (the
ONNX Runtime builder and the TensorRT-LLM plan).

The backends differ only where their runtimes do, and each difference is stated here once: the default tree (a small
one on the CPU, which pays for every slot a verify step feeds; upstream's `mc_sim_7b_63` on a GPU, as
tensorrtllm_backend's config.pbtxt defaults an unset `medusa_choices` / `eagle_choices`), EAGLE-2's dynamic tree (CPU
only), lookahead and draft-target engines (TensorRT-LLM only; the CPU backend runs lookahead per request), and
TensorRT-LLM's EAGLE-1 depth rule (tensorrt_llm/llmapi/llm_args.py). Each rule in full: docs/design.md (Backends).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.model_shape import REDRAFTER_ARCHITECTURES, ModelShape
from trtspec.engine.manifest import Backend, Method
from trtspec.errors import BuildError, ConfigError
from trtspec.speculative.tree import DynamicTree, Tree, build_tree, parse_choices
from trtspec.speculative.tree_presets import preset

# TensorRT-LLM's own default for Medusa and EAGLE-1: TensorRT-LLM tensorrt_llm/llmapi/llm_args.py
# `mDefaultEagleChoices`; tensorrtllm_backend tensorrt_llm/config.pbtxt serves it when the choices are unset
DEFAULT_TREE = {Backend.ONNX: "medusa_small_8", Backend.TRTLLM: "mc_sim_7b_63"}
DRAFTER_ARCHITECTURES = ("MedusaForCausalLM", "EagleForCausalLM")


@dataclass(frozen=True, kw_only=True)
class MethodRequest:
    """What a person asked for, from the CLI, a recipe or a library call (build options of either backend)."""

    source: Path  # the checkpoint folder (named in errors)
    no_spec: bool = False
    choices: str | None = None
    preset: str | None = None
    max_draft_len: int | None = None
    dynamic_tree: DynamicTree | None = None  # onnx: EAGLE-2
    lookahead: object | None = None  # trtllm: Lookahead(W, N, G)
    draft_target: bool = False  # trtllm

    @classmethod
    def of(cls, opts) -> MethodRequest:
        """From BuildOptions (onnx) or TrtllmBuildOptions (trtllm): the fields each has."""
        return cls(source=Path(opts.source), no_spec=opts.no_spec, choices=opts.choices, preset=opts.preset,
                   max_draft_len=opts.max_draft_len, dynamic_tree=getattr(opts, "dynamic_tree", None),
                   lookahead=getattr(opts, "lookahead", None), draft_target=getattr(opts, "draft_target", False))

    @property
    def tree_flags(self) -> bool:
        return self.choices is not None or self.preset is not None


def resolve_method(cfg: ModelShape, request: MethodRequest, backend: Backend) -> Method:
    """The engine's method: the checkpoint's drafter unless --no-spec; lookahead / draft-target (trtllm) on a plain
    checkpoint; EAGLE-2 (onnx) where a dynamic tree is asked for. Contradictions are one BuildError naming both."""
    if cfg.architecture in REDRAFTER_ARCHITECTURES:
        return _redrafter(cfg, request, backend)
    drafter = cfg.architecture in DRAFTER_ARCHITECTURES
    if request.lookahead is not None or request.draft_target:
        what = "--lookahead" if request.lookahead is not None else "--draft-target"
        if drafter:
            raise BuildError(f"{what} needs a plain checkpoint, but {request.source} is a {cfg.architecture}; "
                             f"for {what} convert the base alone (`trtspec convert --base ...`)")
        if request.tree_flags:
            raise BuildError(f"{what} drafts without a tree; drop --choices / --preset")
        return Method.LOOKAHEAD if request.lookahead is not None else Method.DRAFT_TARGET
    if request.no_spec or not drafter:
        if request.tree_flags or request.dynamic_tree:
            hint = " (or pass --lookahead W,N,G / --draft-target)" if backend is Backend.TRTLLM else ""
            raise BuildError(f"{request.source} has no drafter ({cfg.architecture}); tree options need a Medusa or "
                             f"EAGLE checkpoint{hint}")
        return Method.NONE
    if cfg.architecture == "MedusaForCausalLM":
        if request.dynamic_tree:
            raise BuildError("a dynamic (EAGLE-2) tree needs an EAGLE checkpoint; Medusa trees are static")
        return Method.MEDUSA
    return Method.EAGLE2 if request.dynamic_tree else Method.EAGLE


def _redrafter(cfg: ModelShape, request: MethodRequest, backend: Backend) -> Method:
    """A ReDrafter checkpoint builds a ReDrafter engine on either backend: trtllm-build builds any checkpoint with
    redrafter_* fields with its drafter (tensorrt_llm/builder.py `build` sets explicit_draft_tokens itself), the
    onnx backend exports the drafter beside the base; the drafter drafts its own beams, so no tree, lookahead or
    draft-target applies."""
    where = request.source / "config.json"
    asked = [flag for flag, given in (("--no-spec", request.no_spec), ("--choices", request.choices is not None),
                                      ("--preset", request.preset is not None), ("--lookahead", request.lookahead),
                                      ("--draft-target", request.draft_target)) if given]
    if asked:
        raise BuildError(f"{where}: {' / '.join(asked)} does not apply to a ReDrafter checkpoint "
                         f"({cfg.architecture}): TensorRT-LLM builds it with its drafter, which drafts its own beams; "
                         "drop it, or for another method convert the base alone (`trtspec convert --base ...`)")
    return Method.REDRAFTER


def resolve_tree(cfg: ModelShape, method: Method, request: MethodRequest, backend: Backend) -> Tree | None:
    """The static tree of a Medusa / EAGLE-1 engine: --choices, --preset or the default (`default_choices`), checked
    against the checkpoint (Medusa: no deeper than its heads; TensorRT-LLM EAGLE-1: exactly its layers deep, at most
    max_non_leaves_per_layer expanding nodes per level). The hints name `build`'s flags or `trtspec convert`'s."""
    if method not in (Method.MEDUSA, Method.EAGLE):
        return None
    if request.tree_flags:
        choices = parse_choices(request.choices) if request.choices is not None else preset(request.preset)
    else:
        choices = default_choices(cfg, method, backend)
    if backend is Backend.ONNX:
        tree = build_tree(choices, max_draft_len=request.max_draft_len)
        check_tree_fits(tree, cfg, method, backend)
        return tree
    where = "" if request.tree_flags else f" (the default tree {DEFAULT_TREE[backend]})"
    try:
        tree = build_tree(choices)
        check_tree_fits(tree, cfg, method, backend)
    except ConfigError as e:
        raise BuildError(f"{request.source / 'config.json'}{where}: {e}") from None
    return tree


def default_choices(cfg: ModelShape, method: Method, backend: Backend) -> list[list[int]]:
    """The backend's default tree (DEFAULT_TREE) where the checkpoint can draft it, else a chain as deep as the
    checkpoint drafts: one level per Medusa head (both backends), exactly num_eagle_layers levels for TensorRT-LLM's
    EAGLE-1. A chain fits any such checkpoint; `--choices` / `--preset` choose a wider tree."""
    choices = preset(DEFAULT_TREE[backend])
    try:
        check_tree_fits(build_tree(choices), cfg, method, backend)
    except ConfigError:
        depth = cfg.num_medusa_heads if method is Method.MEDUSA else cfg.num_eagle_layers
        return [[0] * d for d in range(1, depth + 1)]
    return choices


def check_tree_fits(tree: Tree, cfg: ModelShape, method: Method, backend: Backend) -> None:
    """ConfigError where the checkpoint cannot draft `tree`: a Medusa head per level (TensorRT-LLM reads the same
    rule, tensorrtllm_backend tensorrt_llm/config.pbtxt); TensorRT-LLM's EAGLE-1 drafts exactly num_eagle_layers
    levels with at most max_non_leaves_per_layer expanding nodes each (TensorRT-LLM tensorrt_llm/llmapi/llm_args.py)."""
    heads = cfg.num_medusa_heads
    if method is Method.MEDUSA and heads is not None and tree.depth > heads:
        raise ConfigError(f"tree depth {tree.depth} exceeds the {heads} Medusa heads (one per level); pass a tree at "
                          f"most {heads} deep (--choices / --preset), or a checkpoint converted with more heads "
                          "(`trtspec convert --num-medusa-heads N`)")
    if method is not Method.EAGLE or backend is not Backend.TRTLLM:
        return
    layers, widest = cfg.num_eagle_layers, cfg.max_non_leaves_per_layer
    if layers is not None and tree.depth != layers:
        raise ConfigError(f"EAGLE-1 needs tree depth == num_eagle_layers = {layers}, but the tree has depth "
                          f"{tree.depth}; pass a tree {layers} deep (--choices / --preset), or reconvert with "
                          f"`trtspec convert --num-eagle-layers {tree.depth}`")
    for level, count in enumerate(tree.non_leaves_per_level()):
        if widest is not None and count > widest:
            raise ConfigError(f"tree level {level} has {count} non-leaf nodes, above the checkpoint's "
                              f"max_non_leaves_per_layer {widest}; pass a narrower tree (--choices / --preset), or "
                              f"reconvert with `trtspec convert --max-non-leaves-per-layer {count}`")
