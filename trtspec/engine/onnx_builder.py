"""`trtspec build --backend onnx`: a TRT-LLM checkpoint → ONNX graphs with the padded static-K profile.

Writes context.onnx (variable prompt length), generation.onnx (the verify step over any slot count: the manifest lists
the slot profiles the runtime pads a step to, by default 2, 3, 5, 9, 17, ... up to K + 1), their shared
weights, the EAGLE draft graphs when the checkpoint has a draft, the tokenizer, and manifest.json last.
Every inconsistency is rejected before anything is exported; every graph is checked and compared with the
torch reference network on random inputs.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from trtspec import __version__
from trtspec.checkpoint.convert import PROVENANCE_FILE
from trtspec.checkpoint.draft_vocab import read_checkpoint_vocab
from trtspec.checkpoint.hf_config import read_json
from trtspec.checkpoint.awq import W4A16_AWQ
from trtspec.checkpoint.model_shape import REDRAFTER_ARCHITECTURES, ModelShape, ReDrafterBeams
from trtspec.checkpoint.quantization import AWQ_DEFAULT_GROUP, CheckpointQuantization, checkpoint_weight_format
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.engine.build_options import EngineBuildOptions, read_checkpoint_config
from trtspec.engine.resolve import MethodRequest, resolve_method, resolve_tree
from trtspec.engine.manifest import (MATMUL_BLOCK, MATMUL_NBITS, ONNX_GRAPH_FORMAT, Backend, EngineWeights, Manifest,
                                     Method, ModelInfo, Profile, WeightFormat, default_slot_profiles,
                                     parse_slot_profiles)
from trtspec.errors import BuildError, ConfigError
from trtspec.native import BLOCK_MATMUL_BLOCK_SIZE
from trtspec.model.quantize import (ACCURACY_LEVEL, DEFAULT_BLOCK_SIZE, QuantScheme, QuantSpec, WeightDtype,
                                    check_block_size)
from trtspec.engine.integrity import record_files
from trtspec.outdir import atomic_output_dir, check_output_dir
from trtspec.speculative.tree import DynamicTree

log = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json")
# max |ORT − torch reference| / max(1, |reference|) per output: fp32 rounding over a real model's layers stays well
# under it, a wrong weight or rope far over it (tests/model/test_reference_parity holds both; figures:
# docs/results-quantization.md)
NUMERICS_TOLERANCE = 1e-3
# Quantized weights are checked with the same tolerance, against the reference computing with the same dequantized
# weights, on twins of the graphs whose MatMulNBits run at accuracy level 1 (fp32 arithmetic over the dequantized
# blocks). The shipped level-4 graphs also round each activation block to int8, which no float reference
# reproduces, so their deviation is logged, not bounded; quality is measured on real text instead.
CHECK_ACCURACY_LEVEL = 1


@dataclass(frozen=True, kw_only=True)
class BuildOptions(EngineBuildOptions):
    dynamic_tree: DynamicTree | None = None  # EAGLE-2 instead of a static tree
    profiles: str | None = None  # `--profiles 2,4,8,16`: verify-step slot counts (default: 2, 3, 5, 9, ... K + 1)
    # `--weights fp32|int8|int4`: the target's linear layers and lm_head (None: fp32, or the format a W8A16 / W4A16
    # checkpoint asks for)
    weights: str | None = None
    lm_head_weights: str | None = None  # `--lm-head-weights fp32|int8|int4`: the lm_head (+ tied embedding) apart
    block_size: int | None = None  # `--block-size 32|64|128` (quantized weights; default 32)
    int4_scheme: str | None = None  # `--int4-scheme symmetric|min` (int4 components; default symmetric)
    quantize_heads: bool = True  # the Medusa heads / EAGLE draft in the --weights format too (else fp32)
    # `--fp32-prefill`: the context graph reads fp32 copies of the quantized linear layers (onnx_graph.WeightPlan)
    fp32_prefill: bool = False
    # `--native-matmul`: the target's quantized products (prompt and decode steps) run trtspec's BlockMatMul
    native_matmul: bool = False
    attention: str | None = None  # `--attention tree|gqa` (default: attention_kernel)


def plan_build(opts: BuildOptions) -> Manifest:
    """Validate the build and return the manifest it will write (without files and numerics)."""
    from trtspec.model.onnx_graph import check_supported  # onnx, imported when a build is planned

    raw = read_checkpoint_config(opts.source)
    cfg = ModelShape.from_trtllm(raw)
    check_supported(cfg)
    plan = weight_plan(opts, raw)
    request = MethodRequest.of(opts)
    method = resolve_method(cfg, request, Backend.ONNX)
    tree = resolve_tree(cfg, method, request, Backend.ONNX)
    beams = ReDrafterBeams.from_trtllm(raw) if method is Method.REDRAFTER else None
    draft_tokens = (opts.dynamic_tree.total_tokens if method is Method.EAGLE2 else tree.num_nodes if tree
                    else beams.max_draft_len if beams else 0)
    k = opts.max_draft_len if opts.max_draft_len is not None else draft_tokens
    if k < draft_tokens:
        what = ("EAGLE-2 total_tokens" if method is Method.EAGLE2 else f"the tree's {tree.num_nodes} nodes" if tree
                else f"the {beams.num_beams} beams x {beams.draft_len_per_beam} draft tokens (the checkpoint's "
                     "redrafter_num_beams, redrafter_draft_len_per_beam)")
        smaller = ("or convert with fewer --redrafter-num-beams / --redrafter-draft-len-per-beam" if beams
                   else "or a smaller tree")
        raise BuildError(f"--max-draft-len {k} is smaller than {what}; pass --max-draft-len {draft_tokens} {smaller}")
    if beams and k != draft_tokens:
        raise BuildError(f"--max-draft-len {k}: a ReDrafter engine's K is its {beams.num_beams} beams x "
                         f"{beams.draft_len_per_beam} draft tokens = {draft_tokens}; drop --max-draft-len")
    max_seq_len = opts.max_seq_len or max(2 * opts.max_input_len, opts.max_input_len + k + 1)
    if max_seq_len > cfg.max_position_embeddings:
        raise BuildError(f"--max-seq-len {max_seq_len} exceeds the model's max_position_embeddings="
                         f"{cfg.max_position_embeddings} ({Path(opts.source) / 'config.json'})")
    slots = parse_slot_profiles(opts.profiles, k) if opts.profiles is not None else default_slot_profiles(k)
    profile = Profile(max_batch_size=opts.max_batch_size, max_input_len=opts.max_input_len,
                      max_seq_len=max_seq_len, max_draft_len=k, slot_profiles=slots)
    end_id, pad_id = _special_ids(_tokenizer_dir(opts))
    draft_vocab = read_checkpoint_vocab(opts.source, cfg.vocab_size) if cfg.eagle is not None else None
    model = ModelInfo.of(cfg, end_id=end_id, pad_id=pad_id, draft_vocab_size=draft_vocab.size if draft_vocab else 0)
    return Manifest(name=opts.name or Path(opts.out).name, backend=Backend.ONNX, method=method,
                    model=model, profile=profile,
                    tree=tree.choices if tree is not None else None,
                    dynamic_tree=vars(opts.dynamic_tree) if method is Method.EAGLE2 else None,
                    redrafter=beams.to_dict() if beams else None,
                    source=str(Path(opts.source).resolve()), versions=_versions(), graph_format=ONNX_GRAPH_FORMAT,
                    weights=_engine_weights(plan, cfg, embedding_gathered=_gathers_embedding(plan, cfg)),
                    matmul_kernel=MATMUL_BLOCK if plan.native_matmul else MATMUL_NBITS, **_attention(opts, plan))


def attention_kernel(opts: BuildOptions) -> str:
    """The target generation graph's attention kernel: --attention, else TreeAttention. Its query rows compute
    alike in plain and verify steps at any place of any tree, so speculation is exact on every engine: with
    GroupQueryAttention a tree slot on a second branch differs from plain decoding in the last bits (fp32: 2e-5 in
    the logits, which flips a token only at such a near-tie; quantized: int8 activation rounding turns it into
    different tokens, so those engines draft chains; see quantize.PLAIN_STEP_SLOTS). It decodes fp32 as fast and
    quantized weights faster (docs/quantization.md, TreeAttention)."""
    from trtspec.model.onnx_ops import ATTENTION_KERNELS  # onnx, imported when a build is planned

    if opts.attention is not None:
        if opts.attention not in ATTENTION_KERNELS:
            raise ConfigError(f"--attention {opts.attention!r}: expected one of {', '.join(ATTENTION_KERNELS)}")
        return opts.attention
    return "tree"


def _attention(opts: BuildOptions, plan) -> dict:
    """The manifest's attention fields: the kernel, and the rows GroupQueryAttention is padded to (1 for tree)."""
    kernel = attention_kernel(opts)
    return {"attention": kernel, "attention_rows": plan.attention_rows if kernel == "gqa" else 1}


def _awq_group_size(source: Path, raw_config: dict) -> int:
    """A W4A16_AWQ checkpoint's group size (config.json quantization.group_size), checked against what MatMulNBits'
    CPU kernels take (its groups become MatMulNBits blocks)."""
    from trtspec.model.quantize import BLOCK_SIZES

    group = CheckpointQuantization.from_config(raw_config).group_size or AWQ_DEFAULT_GROUP
    if group not in BLOCK_SIZES:
        raise BuildError(f"{Path(source) / 'config.json'}: quantization.group_size={group}: W4A16_AWQ groups become "
                         f"MatMulNBits blocks, which take {', '.join(map(str, BLOCK_SIZES))}; re-export with "
                         "--awq_block_size 128 (or 64)")
    return group


def weight_plan(opts: BuildOptions, raw_config: dict):
    """The matrices to quantize (onnx_graph.WeightPlan) from --weights / --block-size / --quantize-heads, after
    refusing a checkpoint that is quantized already (the onnx backend quantizes from fp32 / fp16 / bf16 only)."""
    from trtspec.model.onnx_graph import WeightPlan

    asked = checkpoint_weight_format(opts.source, raw_config)  # refuses what the onnx backend cannot run
    weights = opts.weights if opts.weights is not None else asked or "fp32"
    dtype = WeightDtype.parse(weights) if isinstance(weights, str) else WeightDtype(weights)
    if asked is not None and dtype is not WeightDtype(asked):
        algo = (raw_config.get("quantization") or {}).get("quant_algo")
        raise ConfigError(f"--weights {dtype.value}: {Path(opts.source) / 'config.json'} asks for quant_algo={algo} "
                          f"({asked} weights); pass --weights {asked} or build from a checkpoint without quant_algo")
    head = dtype if opts.lm_head_weights is None else WeightDtype.parse(opts.lm_head_weights, "--lm-head-weights")
    scheme = QuantScheme.parse(opts.int4_scheme) if opts.int4_scheme is not None else QuantScheme.SYMMETRIC
    if dtype is WeightDtype.FP32 and head is WeightDtype.FP32:
        if opts.block_size is not None:
            raise ConfigError(f"--block-size {opts.block_size}: applies to --weights int8 or int4, not fp32")
    block_size = check_block_size(opts.block_size if opts.block_size is not None else DEFAULT_BLOCK_SIZE)
    if scheme is QuantScheme.MIN:
        _check_min_scheme(raw_config, dtype, head, block_size)
    if opts.fp32_prefill and dtype is WeightDtype.FP32:
        raise ConfigError("--fp32-prefill: applies to quantized linear layers (--weights int8 or int4); with "
                          "--weights fp32 the prompt already runs fp32 products")
    if opts.native_matmul:
        if dtype is WeightDtype.FP32:
            raise ConfigError("--native-matmul: applies to quantized linear layers (--weights int8 or int4), not "
                              "--weights fp32")
        if opts.fp32_prefill:
            raise ConfigError("--native-matmul and --fp32-prefill: choose one (the prompt's products run either "
                              "BlockMatMul over the blocks or fp32 copies)")
    if dtype is WeightDtype.FP32 and head is WeightDtype.FP32:
        return WeightPlan()

    def spec(d: WeightDtype) -> QuantSpec | None:
        if d is WeightDtype.FP32:
            return None
        return QuantSpec(d, block_size, scheme=scheme if d is WeightDtype.INT4 else QuantScheme.SYMMETRIC)

    base = spec(dtype)
    if CheckpointQuantization.from_config(raw_config).quant_algo == W4A16_AWQ:  # the layers' codes as stored
        base = QuantSpec(dtype, _awq_group_size(opts.source, raw_config), prequantized=W4A16_AWQ)
        log.info("W4A16_AWQ checkpoint: the linear layers keep its int4 codes, group scales and pre-quant scales; "
                 "the lm_head and drafter are quantized here (--lm-head-weights, --block-size %d)", block_size)
    if not opts.quantize_heads:
        log.info("--no-quantize-heads: the Medusa heads / EAGLE draft keep fp32 weights")
    if opts.native_matmul and base.block_size != BLOCK_MATMUL_BLOCK_SIZE:  # base: --weights int8 / int4 (above)
        given = ("the checkpoint's linear layers keep groups of" if base.prequantized else "--block-size is")
        raise ConfigError(f"--native-matmul: BlockMatMul runs blocks of {BLOCK_MATMUL_BLOCK_SIZE}; {given} "
                          f"{base.block_size}")
    return WeightPlan(base=base, drafter=spec(dtype) if opts.quantize_heads else None, lm_head=spec(head),
                      prefill_fp32=opts.fp32_prefill, native_matmul=opts.native_matmul)


def _check_min_scheme(raw_config: dict, dtype: WeightDtype, head: WeightDtype, block_size: int) -> None:
    """`--int4-scheme min` needs an int4 component and whole blocks along every quantized matrix's inputs (the graph
    sums the activations block by block)."""
    if WeightDtype.INT4 not in (dtype, head):
        raise ConfigError(f"--int4-scheme min: applies to int4 weights (--weights int4 or --lm-head-weights int4), "
                          f"not --weights {dtype.value} with an {head.value} lm_head")
    if CheckpointQuantization.from_config(raw_config).quant_algo == W4A16_AWQ and head is not WeightDtype.INT4:
        raise ConfigError("--int4-scheme min: the W4A16_AWQ checkpoint's layers keep their own symmetric codes; "
                          "min applies only to an int4 lm_head here (--lm-head-weights int4)")
    cfg = ModelShape.from_trtllm(raw_config)
    inputs = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
              "num_heads x head_dim": cfg.num_heads * cfg.head_dim}
    if cfg.eagle is not None:
        inputs["eagle intermediate_size"] = cfg.eagle.intermediate_size
    for name, k in inputs.items():
        if k % block_size:
            raise ConfigError(f"--int4-scheme min: {name} {k} is not a multiple of --block-size {block_size} (the "
                              "min scheme needs whole blocks); pass a --block-size that divides it")


def _gathers_embedding(plan, cfg: ModelShape) -> bool:
    """The plan's guess whether the embedding reads the quantized lm_head's rows: tied (config.json) and whole
    blocks per row. The writer decides from the tensors themselves (onnx_ops.tie_quantized); `build` records what
    the written graph does."""
    return cfg.tie_word_embeddings and plan.lm_head is not None and cfg.hidden_size % plan.lm_head.block_size == 0


def _engine_weights(plan, cfg: ModelShape, *, embedding_gathered: bool) -> EngineWeights:
    def fmt(spec: QuantSpec | None) -> WeightFormat:
        return WeightFormat() if spec is None else WeightFormat(dtype=spec.dtype, block_size=spec.block_size,
                                                                accuracy_level=spec.accuracy_level,
                                                                prequantized=spec.prequantized, scheme=spec.scheme)

    has_drafter = cfg.num_medusa_heads > 0 or cfg.eagle is not None or cfg.architecture in REDRAFTER_ARCHITECTURES
    return EngineWeights(linear=fmt(plan.base), lm_head=fmt(plan.lm_head),
                         embedding=fmt(plan.lm_head) if embedding_gathered else WeightFormat(),
                         drafter=fmt(plan.drafter) if has_drafter else None,
                         prefill=WeightFormat() if plan.prefill_fp32 else None)


def build(opts: BuildOptions) -> Manifest:
    """Plan, export, check, compare with the reference, and write the engine dir atomically."""
    from trtspec.model.onnx_check import check_graph
    from trtspec.model.onnx_graph import export_graphs

    manifest = plan_build(opts)
    check_output_dir(Path(opts.out), force=opts.force)
    if manifest.native_ops:  # the numerics check runs the graphs: say so now, not after the export
        from trtspec import native

        native.library_path()
    ckpt = read_trtllm_checkpoint(opts.source)
    with atomic_output_dir(Path(opts.out), force=opts.force) as tmp:
        p = manifest.profile  # a step's slots may reach K + 1 positions past max_seq_len - 1 (see OrtEngine)
        plan = weight_plan(opts, ckpt.config)
        graphs = export_graphs(ckpt, tmp, max_positions=p.max_seq_len + p.tokens_per_step, weights=plan,
                               attention=manifest.attention)
        gathered = graphs["context"].embeds_quantized_lm_head
        manifest = replace(manifest, weights=_engine_weights(plan, ModelShape.from_trtllm(ckpt.config),
                                                             embedding_gathered=gathered),
                           **_attention(opts, plan))
        for graph in graphs.values():
            check_graph(graph.path)
        numerics = _numerics(opts, tmp, graphs, plan, generation_tokens=max(p.tokens_per_step, 2))
        worst = max(numerics.items(), key=lambda kv: kv[1])
        what = "" if not plan.quantizes else " with the same dequantized weights"
        if worst[1] > NUMERICS_TOLERANCE:
            raise BuildError(f"exported graph output {worst[0]} differs from the torch reference{what} by "
                             f"{worst[1]:.2e} of its scale (tolerance {NUMERICS_TOLERANCE:.0e}); this is a trtspec "
                             "bug, please report it")
        files = {role: g.path.name for role, g in graphs.items()}
        files.update({p.stem: p.name for p in tmp.glob("*.bin")})
        tokenizer = _copy_tokenizer(_tokenizer_dir(opts), tmp)
        checksums = record_files(tmp, [*files.values(), *([tokenizer] if tokenizer else [])])
        manifest = replace(manifest, files=files, numerics=numerics, tokenizer=tokenizer, checksums=checksums)
        manifest.write(tmp)
    return manifest


def _numerics(opts: BuildOptions, tmp: Path, graphs: dict, plan, *, generation_tokens: int) -> dict[str, float]:
    """The graphs' deviation from the reference per output; quantized: that of their accuracy-level-1 twins
    (CHECK_ACCURACY_LEVEL, deleted after), the shipped graphs' own deviation logged."""
    from trtspec.model.onnx_check import compare_with_reference, with_accuracy_level

    if not plan.quantizes:
        return compare_with_reference(opts.source, tmp, graphs, generation_tokens=generation_tokens)
    twins = with_accuracy_level(graphs, CHECK_ACCURACY_LEVEL, ".check")
    try:
        numerics = compare_with_reference(opts.source, tmp, twins, generation_tokens=generation_tokens, weights=plan)
    finally:
        for twin in twins.values():
            twin.path.unlink(missing_ok=True)
    shipped = compare_with_reference(opts.source, tmp, graphs, generation_tokens=generation_tokens, weights=plan)
    role, worst = max(shipped.items(), key=lambda kv: kv[1])
    log.info("quantized graphs at accuracy level %d (int8 activations) vs the dequantized reference on a random step: "
             "at most %.1e of scale (%s); at accuracy level %d: %.1e", ACCURACY_LEVEL, worst, role,
             CHECK_ACCURACY_LEVEL, max(numerics.values()))
    return numerics


def _tokenizer_dir(opts: BuildOptions) -> Path | None:
    """The tokenizer folder: --tokenizer, else the HF base the checkpoint was converted from."""
    if opts.tokenizer is not None:
        if not (Path(opts.tokenizer) / "tokenizer.json").is_file():
            raise ConfigError(f"--tokenizer {opts.tokenizer}: no tokenizer.json there")
        return Path(opts.tokenizer)
    provenance = Path(opts.source) / PROVENANCE_FILE
    if provenance.is_file():
        base = Path(read_json(provenance).get("base", ""))
        if (base / "tokenizer.json").is_file():
            return base
    return None


def _special_ids(tokenizer_dir: Path | None) -> tuple[int | None, int | None]:
    """End and pad ids from generation_config.json / config.json of the tokenizer's folder."""
    if tokenizer_dir is None:
        return None, None
    ids: dict = {}
    for name in ("config.json", "generation_config.json"):  # the later file wins, as in transformers
        if (tokenizer_dir / name).is_file():
            raw = read_json(tokenizer_dir / name)
            ids.update({k: raw[k] for k in ("eos_token_id", "pad_token_id") if raw.get(k) is not None})
    first = lambda v: v[0] if isinstance(v, list) else v  # noqa: E731
    return first(ids.get("eos_token_id")), first(ids.get("pad_token_id"))


def _copy_tokenizer(source: Path | None, engine_dir: Path) -> str | None:
    if source is None:
        log.warning("no tokenizer found (pass --tokenizer DIR); the engine will take token ids only")
        return None
    target = engine_dir / "tokenizer"
    target.mkdir()
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    return "tokenizer"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {"trtspec": __version__}
    for pkg in ("onnx", "onnxruntime", "torch"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def plan_summary(manifest: Manifest) -> str:
    """The dry-run plan, as printed by `trtspec build --dry-run`."""
    return json.dumps(manifest.to_dict(), indent=2)
