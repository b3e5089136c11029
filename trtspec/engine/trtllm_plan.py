"""`trtspec build --backend trtllm`, the plan: a TRT-LLM checkpoint → the exact `trtllm-build` invocation.

Pure (reads the checkpoint's config.json, nothing else): every constraint of the TensorRT-LLM 0.15–1.2.x engine
flow is applied here, before anything runs, so a bad combination fails in seconds with a message naming both
sides instead of at request time on the server. Each rule cites the public upstream file it
follows (TensorRT-LLM, tensorrtllm_backend); `docs/upstream-sources.md` lists them.
"""

from __future__ import annotations

import enum
import json
import math
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec import __version__
from trtspec.checkpoint.model_shape import ModelShape, ReDrafterBeams
from trtspec.engine.build_options import EngineBuildOptions, read_checkpoint_config
from trtspec.engine.manifest import Backend, Manifest, Method, ModelInfo, Profile
from trtspec.engine.resolve import DEFAULT_TREE, MethodRequest, resolve_method, resolve_tree
from trtspec.engine.trtllm_quant import TrtllmQuantization, plan_quantization, quantization_notes
from trtspec.engine.trtllm_versions import TrtllmVersion, installed_version, newest, parse_version
from trtspec.errors import BuildError, CheckpointError, ConfigError
from trtspec.speculative.tree import Tree
from trtspec.speculative.tree_presets import preset

DEFAULT_MAX_NUM_TOKENS = 8192  # trtllm-build's default (TensorRT-LLM tensorrt_llm/commands/build.py)
EAGLE_MAX_BATCH_SIZE = 512  # TensorRT-LLM tensorrt_llm/builder.py: asserted by builder.build() for EAGLE
EAGLE_MAX_DRAFT_LEN = 256  # TensorRT-LLM tensorrt_llm/builder.py and the EAGLE converter's assert (TensorRT-LLM examples/eagle/convert_checkpoint.py)
CHECKPOINT_VIEW = "checkpoint"  # in the engine dir: the checkpoint with the engine's max_draft_len (CheckpointView)
PADDING_NOTE_RATIO = 2  # a K whose K + 1 slots are at least this many times the tree's gets a note of its cost


class SpecMode(enum.Enum):
    """`--speculative_decoding_mode` values, with the integer bit the engine config.json stores (TensorRT-LLM tensorrt_llm/builder.py Engine.save)."""

    NONE = (None, 1)
    DRAFT_TOKENS_EXTERNAL = ("draft_tokens_external", 2)
    MEDUSA = ("medusa", 4)
    LOOKAHEAD = ("lookahead_decoding", 8)
    EXPLICIT_DRAFT_TOKENS = ("explicit_draft_tokens", 16)  # ReDrafter (TensorRT-LLM examples/redrafter/README.md)
    EAGLE = ("eagle", 32)

    @property
    def flag(self) -> str | None:
        return self.value[0]

    @property
    def bit(self) -> int:
        return self.value[1]


MODE_OF_METHOD = {Method.NONE: SpecMode.NONE, Method.MEDUSA: SpecMode.MEDUSA, Method.EAGLE: SpecMode.EAGLE,
                  Method.LOOKAHEAD: SpecMode.LOOKAHEAD, Method.DRAFT_TARGET: SpecMode.DRAFT_TOKENS_EXTERNAL,
                  Method.REDRAFTER: SpecMode.EXPLICIT_DRAFT_TOKENS}
# The Triton tensorrt_llm model's `decoding_mode` per method (tensorrtllm_backend tensorrt_llm/config.pbtxt); plain and draft-target engines
# sample normally. A Medusa engine with top_k / top_p returns all-zero ids (TensorRT-LLM#1449). ReDrafter's is
# "redrafter" (ExplicitDraftTokens: tensorrtllm_backend inflight_batcher_llm/src/model_instance_state.cc).
DECODING_MODE = {Method.NONE: "top_k_top_p", Method.DRAFT_TARGET: "top_k_top_p", Method.MEDUSA: "medusa",
                 Method.EAGLE: "eagle", Method.LOOKAHEAD: "lookahead", Method.REDRAFTER: "redrafter"}


@dataclass(frozen=True)
class Lookahead:
    """Lookahead decoding's executor-level (W, N, G): window, n-gram size, verification set (TensorRT-LLM examples/lookahead/README.md)."""

    window_size: int
    ngram_size: int
    verification_set_size: int

    def __post_init__(self):
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        if not all(isinstance(x, int) and not isinstance(x, bool) for x in (w, n, g)):
            raise ConfigError(f"--lookahead W,N,G takes three integers, got {w!r},{n!r},{g!r}")
        # TensorRT-LLM tensorrt_llm/llmapi/llm_args.py: (1,1,0) is plain decoding, (2,2,1) the smallest configuration that drafts anything.
        if w < 2 or n < 2 or g < 1:
            raise ConfigError(f"--lookahead {w},{n},{g} drafts nothing; the smallest meaningful (W,N,G) is 2,2,1")

    @property
    def max_draft_len(self) -> int:
        """maxDraftTokens = (N==1 ? 0 : N-2) + (W-1+G)(N-1) (TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, `calculate_speculative_resource_tuple`)."""
        w, n, g = self.window_size, self.ngram_size, self.verification_set_size
        return (0 if n == 1 else n - 2) + (w - 1 + g) * (n - 1)

    def to_dict(self) -> dict[str, int]:
        return {"window_size": self.window_size, "ngram_size": self.ngram_size,
                "verification_set_size": self.verification_set_size}

    @classmethod
    def parse(cls, text: str) -> Lookahead:
        try:
            w, n, g = (int(x) for x in str(text).split(","))
        except ValueError:
            raise ConfigError(f"--lookahead expects W,N,G (three integers, e.g. 7,7,7), got {text!r}") from None
        return cls(w, n, g)


@dataclass(frozen=True, kw_only=True)
class TrtllmBuildOptions(EngineBuildOptions):
    """max_seq_len is prompt + output: trtllm-build adds the draft slots itself (TensorRT-LLM tensorrt_llm/builder.py)."""

    trtllm_version: str | None = None  # default: the installed tensorrt_llm, else the newest supported
    lookahead: Lookahead | None = None  # plain checkpoint → lookahead decoding
    draft_target: bool = False  # plain checkpoint → a target that verifies an external draft model's tokens
    max_num_tokens: int | None = None
    weights: str | None = None  # int8 | int4 | fp8: TensorRT-LLM weight-only INT8, INT4-AWQ, FP8 (trtllm_quant)
    block_size: int | None = None  # INT4-AWQ group (quantize.py --awq_block_size)
    quantize_heads: bool = False  # the Medusa heads quantized too (--quant_medusa_head); see trtllm_quant.HEADS_NOTE

    def __post_init__(self):
        super().__post_init__()
        if self.lookahead is not None and self.draft_target:
            raise ConfigError("pass either --lookahead or --draft-target, not both")


@dataclass(frozen=True)
class CheckpointView:
    """The checkpoint as trtllm-build must read it when the engine's K is not the checkpoint's: Medusa and EAGLE-1
    engines size their draft inputs by the checkpoint's config.json, whatever --max_draft_len says (TensorRT-LLM
    tensorrt_llm/models/medusa/model.py `max_medusa_token_len`, tensorrt_llm/models/eagle/model.py `max_draft_len`,
    both `= config.max_draft_len`; the C++ runtime reads pretrained_config, tensorrt_llm/builder.py Engine.save). So
    `build` writes `path`: config.json with max_draft_len set, every other file of `source` linked (the weights do
    not depend on K)."""

    path: Path  # ENGINE/checkpoint
    source: Path  # the checkpoint it stands for
    max_draft_len: int

    def to_dict(self) -> dict:
        return {"path": str(self.path), "source": str(self.source), "max_draft_len": self.max_draft_len}


@dataclass(frozen=True)
class TrtllmPlan:
    """What `build` runs and what it expects back: the command, the engine config fields, the runtime config."""

    version: TrtllmVersion
    argv: tuple[str, ...]
    build_config: dict  # fields the engine's config.json `build_config` must hold after trtllm-build
    pretrained_config: dict  # fields its `pretrained_config` must hold
    runtime: dict  # what the server side needs: decoding_mode, the C++ choices string, lookahead, ...
    manifest: Manifest  # written last by build (files and tokenizer filled in then)
    notes: tuple[str, ...] = ()  # what the engine will not do that the checkpoint asks for (printed, logged)
    quantization: TrtllmQuantization | None = None  # None: the checkpoint's float dtype
    checkpoint_view: CheckpointView | None = None  # what trtllm-build reads when K differs from the checkpoint's
    checkpoint_config: dict | None = None  # the checkpoint's config.json as read (not in to_dict)

    @property
    def command_line(self) -> str:
        return shlex.join(self.argv)

    def to_dict(self) -> dict:
        return {"trtllm_version": self.version.text, "container": self.version.container,
                "command": list(self.argv), "command_line": self.command_line,
                "build_config": self.build_config, "pretrained_config": self.pretrained_config,
                "runtime_config": self.runtime, "notes": list(self.notes), "manifest": self.manifest.to_dict(),
                "quantization": None if self.quantization is None else self.quantization.to_dict(),
                "checkpoint_view": None if self.checkpoint_view is None else self.checkpoint_view.to_dict()}

    @property
    def engine_config(self) -> dict:
        """The engine config.json trtllm-build should write, as far as the plan knows it (the checkpoint's
        pretrained_config with the planned fields, the planned build_config): what `doctor` checks a repository
        against before the engine exists."""
        pretrained = {**(self.checkpoint_config or {}), **self.pretrained_config}
        if self.quantization is not None:
            q = self.quantization
            pretrained["quantization"] = {**(pretrained.get("quantization") or {}), "quant_algo": q.quant_algo,
                                          **({"group_size": q.group_size} if q.group_size else {})}
        return {"version": self.version.text, "pretrained_config": pretrained, "build_config": self.build_config}


def plan_trtllm_build(opts: TrtllmBuildOptions) -> TrtllmPlan:
    """Validate the build against the checkpoint and the target version; return the plan."""
    version = _version(opts.trtllm_version)
    config_path = Path(opts.source) / "config.json"
    raw = read_checkpoint_config(opts.source)
    cfg = _model_config(raw, config_path)
    request = MethodRequest.of(opts)
    method = resolve_method(cfg, request, Backend.TRTLLM)
    tree = resolve_tree(cfg, method, request, Backend.TRTLLM)
    beams = _redrafter(raw, cfg, version, config_path) if method is Method.REDRAFTER else None
    k = _max_draft_len(method, tree, opts, beams)
    tp, pp = _mapping(raw, config_path)
    _check_limits(method, k, tree, opts, pp)
    max_seq_len = _max_seq_len(cfg, opts, config_path)
    max_num_tokens = _max_num_tokens(opts, k, max_seq_len, method)
    quant = plan_quantization(opts, raw, cfg, method, k, tp, pp)
    manifest = _manifest(opts, cfg, method, tree, k, max_seq_len, tp, pp, version, beams)
    if quant is not None:
        manifest = replace(manifest, quantization=quant.to_dict())
    argv = _argv(opts, cfg, method, k, max_seq_len, max_num_tokens)
    if quant is not None:
        argv = _with_checkpoint(argv, quant.checkpoint)
    view = None
    if method in (Method.MEDUSA, Method.EAGLE) and k != cfg.max_draft_len \
            and (quant is None or quant.quantize_argv is None):  # quantize.py writes K itself (--max_draft_len)
        view = CheckpointView(Path(opts.out) / CHECKPOINT_VIEW, Path(opts.source) if quant is None
                              else quant.checkpoint, k)
        argv = _with_checkpoint(argv, view.path)
    notes = (*_notes(opts, cfg, method, tree, k, view), *quantization_notes(quant, cfg.dtype))
    return TrtllmPlan(version=version, argv=argv,
                      build_config=_expected_build_config(opts, cfg, method, k, max_seq_len, max_num_tokens),
                      pretrained_config=_expected_pretrained(cfg, method, k, beams),
                      runtime=_runtime(method, tree, k, opts, tp, pp, beams), manifest=manifest,
                      notes=notes, quantization=quant, checkpoint_view=view, checkpoint_config=raw)


def _with_checkpoint(argv: tuple[str, ...], checkpoint: Path) -> tuple[str, ...]:
    out = list(argv)
    out[out.index("--checkpoint_dir") + 1] = str(checkpoint)
    return tuple(out)


def _notes(opts: TrtllmBuildOptions, cfg: ModelShape, method: Method, tree: Tree | None, k: int,
           view: CheckpointView | None) -> tuple[str, ...]:
    """One line per fact the plan settles that a person would otherwise find out on the GPU host."""
    from trtspec.checkpoint.draft_vocab import CHECKPOINT_FILE

    notes = []
    if method is not Method.NONE:
        notes.append("one generation-step profile of max_draft_len + 1 tokens: on a GPU a verify step costs about "
                     "the same at any token count up to it, so TensorRT-LLM pads every draft to it (the onnx backend "
                     "carries several slot profiles instead, because a CPU's verify step grows with its slots)")
    if tree is not None and not MethodRequest.of(opts).tree_flags:
        default = DEFAULT_TREE[Backend.TRTLLM]
        if sorted(map(tuple, tree.choices)) != sorted(map(tuple, preset(default))):
            what = (f"{cfg.num_medusa_heads} Medusa heads" if method is Method.MEDUSA else
                    f"num_eagle_layers {cfg.num_eagle_layers}, max_non_leaves_per_layer {cfg.max_non_leaves_per_layer}")
            notes.append(f"the default tree {default} does not fit the checkpoint ({what}), so the default here is "
                         f"a chain of {tree.depth} (the onnx backend's rule too); --choices / --preset choose a wider "
                         "tree")
    if view is not None:
        notes.append(f"max_draft_len {k} follows the tree ({tree.num_nodes} nodes; the checkpoint says "
                     f"{cfg.max_draft_len}): TensorRT-LLM sizes Medusa / EAGLE engines by the checkpoint's "
                     f"config.json, so trtllm-build reads {view.path}, the checkpoint with max_draft_len {k} "
                     "(config.json rewritten, the rank files linked), which `trtspec build` writes there (with "
                     "--plan-only too)")
    if tree is not None and (k + 1) >= PADDING_NOTE_RATIO * (tree.num_nodes + 1):
        slots = tree.num_nodes + 1
        notes.append(f"max_draft_len {k} pads the {tree.num_nodes}-node tree: every generation step feeds {k + 1} "
                     f"tokens per sequence where the tree needs {slots} ({(k + 1) / slots:.1f}x the tokens a verify "
                     f"step computes, free only while the GPU is underused, and {k + 1 - slots} more KV-cache slots "
                     "per sequence); leave --max-draft-len out to let K follow the tree")
    if cfg.dtype == "float32" and opts.weights is None:
        notes.append(f"the checkpoint is float32, so the engine computes in float32 (--gemm_plugin float32); "
                     "TensorRT-LLM engines are normally float16 or bfloat16 (half the weight memory and bandwidth, "
                     f"tensor-core GEMMs): convert for that with `{_convert_command(opts, method, k)}` (or "
                     "`trtspec convert --dtype bfloat16`) and build from it")
    if method is Method.EAGLE and (Path(opts.source) / CHECKPOINT_FILE).is_file():
        notes.append(f"{Path(opts.source) / CHECKPOINT_FILE}: TensorRT-LLM's EAGLE-1 engine has no reduced draft "
                     "vocabulary, so its draft scores the whole vocabulary (same outputs; a larger draft lm_head)")
    return tuple(notes)


# the `trtspec convert` flags a conversion recorded that a float16 reconversion repeats, per method
CONVERT_FLAGS = {Method.MEDUSA: {"medusa": "--medusa", "num_medusa_heads": "--num-medusa-heads"},
                 Method.EAGLE: {"eagle": "--eagle", "num_eagle_layers": "--num-eagle-layers",
                                "max_non_leaves_per_layer": "--max-non-leaves-per-layer"},
                 Method.REDRAFTER: {"redrafter": "--redrafter", "redrafter_num_beams": "--redrafter-num-beams",
                                    "redrafter_draft_len_per_beam": "--redrafter-draft-len-per-beam",
                                    "trtllm_version": "--trtllm-version"}}


def _convert_command(opts: TrtllmBuildOptions, method: Method, k: int) -> str:
    """`trtspec convert` again in float16, from what the conversion recorded (trtspec-convert.json) where it did."""
    from trtspec.engine.trtllm_quant import PROVENANCE_FILE

    source = Path(opts.source)
    try:
        recorded = json.loads((source / PROVENANCE_FILE).read_text())
    except (OSError, ValueError):
        recorded = {}
    options = recorded.get("options") if isinstance(recorded.get("options"), dict) else {}
    argv = ["trtspec", "convert", "--base", str(recorded.get("base") or "BASE"),
            "--out", str(source.with_name(source.name + "-float16"))]
    flags = {**CONVERT_FLAGS.get(method, {}), "tp_size": "--tp-size", "pp_size": "--pp-size"}
    for key, flag in flags.items():
        value = options.get(key)
        if value is not None and not (key in ("tp_size", "pp_size") and value == 1):
            argv += [flag, str(value)]
    if method in (Method.MEDUSA, Method.EAGLE):
        argv += ["--max-draft-len", str(k)]
    if method is Method.REDRAFTER and options.get("redrafter_greedy_search") is False:
        argv.append("--redrafter-no-greedy-search")
    return shlex.join([*argv, "--dtype", "float16"])


# ---- inputs -------------------------------------------------------------------------------------------

def _version(text: str | None) -> TrtllmVersion:
    if text is not None:
        return parse_version(text)
    installed = installed_version()
    return parse_version(installed) if installed else newest()


def _model_config(raw: dict, path: Path) -> ModelShape:
    try:
        return ModelShape.from_trtllm(raw)
    except CheckpointError as e:
        raise CheckpointError(f"{path}: {e}") from None


def _redrafter(raw: dict, cfg: ModelShape, version: TrtllmVersion, path: Path) -> ReDrafterBeams:
    """The checkpoint's beam search, and its architecture checked against the version's name for it: one
    ReDrafterForCausalLM before 1.0, one class per base family from 1.0 (TensorRT-LLM tensorrt_llm/models/__init__.py
    MODEL_MAP), where trtllm-build looks the architecture up."""
    from trtspec.checkpoint.redrafter import redrafter_architecture

    try:
        beams = ReDrafterBeams.from_trtllm(raw)
    except (CheckpointError, ConfigError) as e:
        raise CheckpointError(f"{path}: {e}") from None
    base = raw["base_model_architecture"]
    try:
        want = redrafter_architecture(base, version.key, where=str(path))
    except ConfigError as e:
        raise BuildError(f"{e} (TensorRT-LLM {version.text}, the build's --trtllm-version)") from None
    if cfg.architecture != want:
        other = "0.21" if version.at_least(1, 0) else "1.0"
        raise BuildError(f"{path}: architecture {cfg.architecture} is not a name TensorRT-LLM {version.text} has "
                         f"(it calls a ReDrafter {base} checkpoint {want}, trtllm-build looks it up in MODEL_MAP); "
                         f"reconvert with `trtspec convert --redrafter DIR --trtllm-version {version.short}`, or "
                         f"build for the checkpoint's release (--trtllm-version {other})")
    return beams


def _mapping(raw: dict, path: Path) -> tuple[int, int]:
    mapping = raw.get("mapping") or {}
    tp, pp = mapping.get("tp_size", 1), mapping.get("pp_size", 1)
    world = mapping.get("world_size", tp * pp)
    if not all(isinstance(x, int) and x >= 1 for x in (tp, pp, world)) or world != tp * pp:
        raise CheckpointError(f"{path}: mapping {mapping} is inconsistent; world_size must equal tp_size * pp_size")
    return tp, pp


def _max_draft_len(method: Method, tree: Tree | None, opts: TrtllmBuildOptions,
                   beams: ReDrafterBeams | None = None) -> int:
    if method is Method.NONE:
        if opts.max_draft_len not in (None, 0):
            raise BuildError(f"--max-draft-len {opts.max_draft_len} needs a speculative method; "
                             "pass --lookahead, --draft-target or a Medusa / EAGLE checkpoint")
        return 0
    if method is Method.LOOKAHEAD:
        k = opts.lookahead.max_draft_len
        if opts.max_draft_len is not None and opts.max_draft_len != k:  # tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md, tensorrtllm_backend#710
            raise BuildError(f"--lookahead {_wng(opts.lookahead)} needs max_draft_len == (N-2)+(W-1+G)(N-1) = {k}, "
                             f"got --max-draft-len {opts.max_draft_len}; drop --max-draft-len")
        return k
    if method is Method.REDRAFTER:  # TensorRT-LLM tensorrt_llm/builder.py `build`: K = beams x length, set whatever --max_draft_len says
        k = beams.max_draft_len
        if opts.max_draft_len is not None and opts.max_draft_len != k:
            raise BuildError(f"a ReDrafter engine's max_draft_len is redrafter_num_beams x redrafter_draft_len_per_beam "
                             f"= {beams.num_beams} x {beams.draft_len_per_beam} = {k} (TensorRT-LLM sets it from the "
                             f"checkpoint), got --max-draft-len {opts.max_draft_len}; drop --max-draft-len, or "
                             "reconvert with other beams (`trtspec convert --redrafter DIR --redrafter-num-beams B "
                             "--redrafter-draft-len-per-beam L`)")
        return k
    if method is Method.DRAFT_TARGET:
        if not opts.max_draft_len or opts.max_draft_len < 1:
            raise BuildError("--draft-target needs --max-draft-len K (the most draft tokens per step, "
                             "the BLS's num_draft_tokens must not exceed it)")
        return opts.max_draft_len
    # Medusa / EAGLE-1: K follows the tree unless given (the checkpoint's own K, convert's default 63, is what the
    # engine would pad every step to otherwise; a CheckpointView gives trtllm-build the K chosen here)
    if opts.max_draft_len is None:
        k = tree.num_nodes
        return k + 1 if k % 32 == 0 else k  # the packed-mask rule of _check_limits: one slot of padding
    k = opts.max_draft_len
    if tree.num_nodes > k:  # number of choices <= max_draft_len (TensorRT-LLM tensorrt_llm/llmapi/llm_args.py, tensorrtllm_backend tensorrt_llm/config.pbtxt)
        raise BuildError(f"the tree has {tree.num_nodes} nodes but --max-draft-len is {k}; leave --max-draft-len out "
                         f"(K follows the tree), pass one >= {tree.num_nodes}, or a smaller tree")
    return k


def _check_limits(method: Method, k: int, tree: Tree | None, opts: TrtllmBuildOptions, pp: int) -> None:
    if method is Method.EAGLE:
        if opts.max_batch_size > EAGLE_MAX_BATCH_SIZE or k > EAGLE_MAX_DRAFT_LEN:  # TensorRT-LLM tensorrt_llm/builder.py
            raise BuildError(f"EAGLE engines take --max-batch-size <= {EAGLE_MAX_BATCH_SIZE} and max_draft_len <= "
                             f"{EAGLE_MAX_DRAFT_LEN}; got {opts.max_batch_size} and {k}")
        if pp > 1:  # TensorRT-LLM examples/eagle/convert_checkpoint.py: no pipeline parallelism for EAGLE
            raise BuildError(f"EAGLE does not support pipeline parallelism; the checkpoint has pp_size={pp}, "
                             "reconvert with `trtspec convert --pp-size 1`")
    # TensorRT-LLM tensorrt_llm/builder.py Engine.save: the engine packs ceil((K+1)/32) mask words per row, the C++ module divUp(K, 32);
    # they disagree exactly when K is a multiple of 32. Draft-target engines take no packed mask (TensorRT-LLM tensorrt_llm/models/generation_mixin.py).
    if method in (Method.MEDUSA, Method.EAGLE, Method.LOOKAHEAD) and k % 32 == 0:
        raise BuildError(f"max_draft_len {k} is a multiple of 32: TensorRT-LLM's engine and C++ runtime disagree "
                         f"on the packed-mask width there ({math.ceil((k + 1) / 32)} vs {k // 32} words); "
                         f"use {k - 1} or {k + 1}")


def _max_seq_len(cfg: ModelShape, opts: TrtllmBuildOptions, config_path: Path) -> int:
    if opts.max_input_len < 1 or opts.max_batch_size < 1:
        raise ConfigError(f"--max-input-len and --max-batch-size must be >= 1, got {opts.max_input_len} and "
                          f"{opts.max_batch_size}")
    limit = _position_limit(cfg)
    max_seq_len = opts.max_seq_len if opts.max_seq_len is not None else min(2 * opts.max_input_len, limit)
    if max_seq_len <= opts.max_input_len:
        given = f"--max-seq-len {max_seq_len}" if opts.max_seq_len is not None else \
            f"max_seq_len {max_seq_len} (the default, min(2 x --max-input-len, the model's {limit} positions))"
        raise ConfigError(f"{given} leaves no room to generate after --max-input-len {opts.max_input_len}; "
                          f"raise --max-seq-len or lower --max-input-len")
    if max_seq_len > limit:
        raise BuildError(f"--max-seq-len {max_seq_len} exceeds what {config_path} supports "
                         f"(max_position_embeddings={cfg.max_position_embeddings}{_rope_note(cfg)}); lower it")
    return max_seq_len


def _position_limit(cfg: ModelShape) -> int:
    """max_position_embeddings × the rope factor, which trtllm-build applies except for llama3 / su / longrope
    scaling (TensorRT-LLM tensorrt_llm/builder.py)."""
    scaling = cfg.rope_scaling or {}
    kind = scaling.get("type") or scaling.get("rope_type")
    factor = scaling.get("factor", 1.0) if kind not in (None, "llama3", "su", "longrope") else 1.0
    return int(cfg.max_position_embeddings * factor)


def _rope_note(cfg: ModelShape) -> str:
    limit = _position_limit(cfg)
    return f" × rope factor = {limit}" if limit != cfg.max_position_embeddings else ""


def _max_num_tokens(opts: TrtllmBuildOptions, k: int, max_seq_len: int, method: Method) -> int:
    floor = opts.max_batch_size * (k + 1)  # TensorRT-LLM tensorrt_llm/builder.py: every sequence feeds K + 1 slots per step
    if opts.max_num_tokens is None:
        return max(min(DEFAULT_MAX_NUM_TOKENS, opts.max_batch_size * max_seq_len), floor)
    if method is not Method.NONE and opts.max_num_tokens < floor:
        raise BuildError(f"--max-num-tokens {opts.max_num_tokens} is below max_batch_size * (max_draft_len + 1) = "
                         f"{opts.max_batch_size} * {k + 1} = {floor}; raise it or lower --max-batch-size")
    if opts.max_num_tokens < opts.max_input_len:
        raise BuildError(f"--max-num-tokens {opts.max_num_tokens} is below --max-input-len {opts.max_input_len}: "
                         "one prompt must fit in a context step; raise it")
    return opts.max_num_tokens


# ---- outputs ------------------------------------------------------------------------------------------

def _argv(opts: TrtllmBuildOptions, cfg: ModelShape, method: Method, k: int, max_seq_len: int,
          max_num_tokens: int) -> tuple[str, ...]:
    mode = MODE_OF_METHOD[method]
    # tp / pp are not flags: trtllm-build takes them from the checkpoint's mapping (TensorRT-LLM tensorrt_llm/models/modeling_utils.py), one rank{r}.engine each
    argv = ["trtllm-build", "--checkpoint_dir", str(opts.source), "--output_dir", str(opts.out),
            "--gemm_plugin", cfg.dtype]  # every example passes the model dtype (TensorRT-LLM tensorrt_llm/builder.py "Requirements")
    if mode is not SpecMode.NONE:
        argv += ["--speculative_decoding_mode", mode.flag, "--max_draft_len", str(k)]
    argv += ["--max_batch_size", str(opts.max_batch_size), "--max_input_len", str(opts.max_input_len),
             "--max_seq_len", str(max_seq_len), "--max_num_tokens", str(max_num_tokens),
             # required for EAGLE and draft-target (both sides, KV reuse), the default on main for the rest;
             # passed always so every version builds the same engine (TensorRT-LLM tensorrt_llm/commands/build.py, tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md)
             "--use_paged_context_fmha", "enable"]
    return tuple(argv)


def _expected_build_config(opts: TrtllmBuildOptions, cfg: ModelShape, method: Method, k: int,
                           max_seq_len: int, max_num_tokens: int) -> dict:
    mode = MODE_OF_METHOD[method]
    return {"max_batch_size": opts.max_batch_size, "max_input_len": opts.max_input_len,
            "max_seq_len": _engine_seq_len(cfg, method, k, max_seq_len), "max_num_tokens": max_num_tokens,
            "max_draft_len": k, "speculative_decoding_mode": mode.bit, "max_beam_width": 1,
            "plugin_config": {"use_paged_context_fmha": True}}


def _engine_seq_len(cfg: ModelShape, method: Method, k: int, max_seq_len: int) -> int:
    """TensorRT-LLM tensorrt_llm/builder.py: trtllm-build adds the draft slots (and EAGLE's layers) to max_seq_len itself."""
    if method is Method.NONE:
        return max_seq_len
    return max_seq_len + k + (cfg.num_eagle_layers if method is Method.EAGLE else 0)


def _expected_pretrained(cfg: ModelShape, method: Method, k: int, beams: ReDrafterBeams | None = None) -> dict:
    out = {"architecture": cfg.architecture, "dtype": cfg.dtype, "vocab_size": cfg.vocab_size}
    if method is Method.MEDUSA:  # TensorRT-LLM tensorrt_llm/builder.py Engine.save: the C++ Medusa module reads these two from pretrained_config
        out.update(max_draft_len=k, num_medusa_heads=cfg.num_medusa_heads)
    if method is Method.EAGLE:  # TensorRT-LLM tensorrt_llm/models/eagle/model.py: the draft inputs are sized by it
        out.update(max_draft_len=k, num_eagle_layers=cfg.num_eagle_layers,
                   max_non_leaves_per_layer=cfg.max_non_leaves_per_layer)
    if method is Method.REDRAFTER:  # TensorRT-LLM gptJsonConfig.cpp: the C++ runtime's K is their product
        out.update(redrafter_num_beams=beams.num_beams, redrafter_draft_len_per_beam=beams.draft_len_per_beam)
    return out


def _runtime(method: Method, tree: Tree | None, k: int, opts: TrtllmBuildOptions, tp: int, pp: int,
             beams: ReDrafterBeams | None = None) -> dict:
    out = {"decoding_mode": DECODING_MODE[method], "tokens_per_step": k + 1, "world_size": tp * pp}
    if tree is not None:
        key = "medusa_choices" if method is Method.MEDUSA else "eagle_choices"
        out.update({key: cpp_choices(tree.choices), "tree_nodes": tree.num_nodes, "tree_depth": tree.depth,
                    "topks": list(tree.topks), "paths": tree.num_leaves,
                    "non_leaves_per_level": list(tree.non_leaves_per_level())})
    if method in (Method.MEDUSA, Method.EAGLE, Method.LOOKAHEAD):
        out["packed_mask_words"] = math.ceil((k + 1) / 32)  # TensorRT-LLM tensorrt_llm/models/generation_mixin.py: P = ceil(T/32), T = K + 1
    if method is Method.LOOKAHEAD:
        n = opts.lookahead.ngram_size  # TensorRT-LLM tensorrt_llm/llmapi/llm_args.py: (maxDecodingTokens, maxPathLen, maxDraftTokens, maxDraftPathLen)
        out["lookahead"] = {**opts.lookahead.to_dict(), "max_decoding_tokens": k + 1, "max_path_len": n,
                            "max_draft_tokens": k, "max_draft_path_len": n - 1}
    if method is Method.REDRAFTER:  # the beam search the engine unrolls: beams of draft_len_per_beam + 1 tokens, each
        # with its true token, flattened to at most K + 1 per step (TensorRT-LLM tensorrt_llm/models/redrafter/model.py)
        out.update({f"redrafter_{key}": value for key, value in beams.to_dict().items()})
    if method is Method.DRAFT_TARGET:
        out["num_draft_tokens"] = k  # the BLS default; requests may ask for fewer, never more (tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py)
    return out


def _manifest(opts: TrtllmBuildOptions, cfg: ModelShape, method: Method, tree: Tree | None, k: int,
              max_seq_len: int, tp: int, pp: int, version: TrtllmVersion,
              beams: ReDrafterBeams | None = None) -> Manifest:
    # the engine's own (raised) max_seq_len: the KV capacity the static-K profile was built for; its one step shape
    # is K + 1 slots
    profile = Profile(max_batch_size=opts.max_batch_size, max_input_len=opts.max_input_len,
                      max_seq_len=_engine_seq_len(cfg, method, k, max_seq_len), max_draft_len=k,
                      slot_profiles=(k + 1,) if k else ())
    model = ModelInfo.of(cfg)
    return Manifest(name=opts.name or Path(opts.out).name, backend=Backend.TRTLLM, method=method, model=model,
                    profile=profile, tree=tree.choices if tree is not None else None,
                    source=str(Path(opts.source).resolve()),
                    versions={"trtspec": __version__, "tensorrt_llm": version.text},
                    lookahead=opts.lookahead.to_dict() if opts.lookahead is not None else None,
                    redrafter=beams.to_dict() if beams is not None else None, tp_size=tp, pp_size=pp)


def cpp_choices(choices) -> str:
    """Choices in the C++ backend's brace syntax, `{0}, {0, 0}, {1}`: the only form both Triton backends parse.

    tensorrtllm_backend tensorrt_llm/config.pbtxt: the C++ backend reads brace groups; Python `[[0], [0, 0]]` parses to nothing and it silently falls
    back to mc_sim_7b_63 with only a warning.
    """
    return ", ".join("{" + ", ".join(str(int(x)) for x in c) + "}" for c in choices)


def _wng(la: Lookahead) -> str:
    return f"{la.window_size},{la.ngram_size},{la.verification_set_size}"
