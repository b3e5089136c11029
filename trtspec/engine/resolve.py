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

from trtspec.checkpoint.model_shape import ModelShape
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
    drafter = cfg.architecture in DRAFTER_ARCHITECTURES
    if request.lookahead is not None or request.draft_target:
        what = "--lookahead" if request.lookahead is not None else "--draft-target"
        if drafter:
            raise BuildError(f"{what} needs a plain checkpoint, but {request.source} is a {cfg.architecture}; "
                             f"convert the base alone (trtspec convert --base ...) for {what}")
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


def resolve_tree(cfg: ModelShape, method: Method, request: MethodRequest, backend: Backend) -> Tree | None:
    """The static tree of a Medusa / EAGLE-1 engine: --choices, --preset or the backend's default, checked against
    the checkpoint (Medusa: no deeper than its heads; TensorRT-LLM EAGLE-1: exactly its layers deep)."""
    if method not in (Method.MEDUSA, Method.EAGLE):
        return None
    default = DEFAULT_TREE[backend]
    choices = parse_choices(request.choices) if request.choices is not None else preset(request.preset or default)
    heads = cfg.num_medusa_heads if method is Method.MEDUSA else None
    if backend is Backend.ONNX:
        if not request.tree_flags and heads is not None and heads < 3:
            choices = [[0] * d for d in range(1, heads + 1)]  # the default tree needs 3 heads; a chain fits any
        return build_tree(choices, num_heads=heads, max_draft_len=request.max_draft_len)
    where = "" if request.tree_flags else f" (the default tree {default})"
    try:
        if method is Method.MEDUSA:  # depth <= heads (tensorrtllm_backend tensorrt_llm/config.pbtxt)
            return build_tree(choices, num_heads=heads)
        return build_tree(choices, exact_depth=cfg.num_eagle_layers,
                          max_non_leaves_per_layer=cfg.max_non_leaves_per_layer)
    except ConfigError as e:
        raise BuildError(f"{request.source / 'config.json'}{where}: {e}") from None
