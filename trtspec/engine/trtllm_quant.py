"""`trtspec build --backend trtllm --weights int8|int4|fp8`: TensorRT-LLM's weight-only INT8, INT4-AWQ and FP8
engines, planned.

trtllm-build builds what the checkpoint holds, so a quantized engine needs a checkpoint quantized first by
TensorRT-LLM's `examples/quantization/quantize.py` (TensorRT Model Optimizer: `--qformat int8_wo` → W8A16,
`int4_awq` → W4A16_AWQ, `fp8` → FP8). A checkpoint quantized already builds as it is; for a float checkpoint that
`trtspec convert` wrote, the plan holds the quantize.py command and `build` runs trtllm-build once its output exists.
The Medusa heads stay in the base dtype by default (quantized heads broke trtllm-build: NVIDIA/TensorRT-LLM#2115,
#1845); quantize.py has no EAGLE draft input. In full: docs/gpu.md (Quantized GPU engines); the upstream files:
docs/upstream-sources.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.engine.manifest import Method
from trtspec.errors import BuildError, ConfigError

# --weights → (quantize.py --qformat, the checkpoint's quant_algo it writes); TensorRT-LLM
# tensorrt_llm/quantization/quantize_by_modelopt.py maps the qformats to these QuantAlgo values
FORMATS = {"int8": ("int8_wo", "W8A16"), "int4": ("int4_awq", "W4A16_AWQ"), "fp8": ("fp8", "FP8")}
WEIGHTS_OF_ALGO = {algo: weights for weights, (_, algo) in FORMATS.items()}
AWQ_BLOCK_SIZES = (64, 128)  # quantize.py --awq_block_size: the groupwise INT4 GEMM's group sizes
DEFAULT_AWQ_BLOCK_SIZE = 128  # quantize.py's default
CALIB_SIZE = 512  # quantize.py's default --calib_size
PROVENANCE_FILE = "trtspec-convert.json"  # checkpoint.convert.PROVENANCE_FILE (not imported: the plan stays light)
QUANTIZE_SCRIPT = "examples/quantization/quantize.py"  # in the TensorRT-LLM source tree / container (/app/tensorrt_llm)
HEADS_NOTE = ("the Medusa heads stay in {dtype} (quantize.py quantizes them only with --quant_medusa_head): "
              "FP8-quantized Medusa heads failed trtllm-build (NVIDIA/TensorRT-LLM#2115) and weight-only quantized "
              "ones crashed it (NVIDIA/TensorRT-LLM#1845); they are a small share of the weights and decide acceptance")


@dataclass(frozen=True)
class TrtllmQuantization:
    """The quantization a TensorRT-LLM engine is planned with."""

    weights: str | None  # int8 | int4 | fp8 (None: a mode --weights has no name for, taken from the checkpoint)
    quant_algo: str
    group_size: int | None  # INT4-AWQ group
    drafter: str | None  # the Medusa heads / EAGLE draft: "float16" (kept in the base dtype), "quantized", "as stored"
    checkpoint: Path  # what trtllm-build reads
    quantize_argv: tuple[str, ...] | None = None  # the quantize.py run that writes `checkpoint` (None: it exists)

    def to_dict(self) -> dict:
        out = {"quant_algo": self.quant_algo, "weights": self.weights, "group_size": self.group_size,
               "drafter": self.drafter, "checkpoint": str(self.checkpoint)}
        if self.quantize_argv is not None:
            out["quantize_command"] = list(self.quantize_argv)
        return out


def plan_quantization(opts, raw: dict, cfg, method: Method, k: int, tp: int, pp: int) -> TrtllmQuantization | None:
    """From --weights / --block-size / --quantize-heads and the checkpoint's own quantization; None: a float engine."""
    source = Path(opts.source)
    where = source / "config.json"
    q = raw.get("quantization") or {}
    algo, weights = q.get("quant_algo"), opts.weights
    if weights is not None and weights not in FORMATS:
        raise ConfigError(f"--weights {weights}: the trtllm backend builds {', '.join(FORMATS)} "
                          "(TensorRT-LLM weight-only INT8, INT4-AWQ, FP8) or the checkpoint's dtype")
    has_drafter = method in (Method.MEDUSA, Method.EAGLE, Method.REDRAFTER)
    if algo is not None:  # quantized already: trtllm-build takes it as it is
        if weights is not None and WEIGHTS_OF_ALGO.get(algo) != weights:
            raise ConfigError(f"--weights {weights}: {where} is quantized already (quant_algo={algo}); leave "
                              "--weights out, or quantize the float checkpoint instead")
        if opts.block_size is not None:
            raise ConfigError(f"--block-size {opts.block_size}: {where} is quantized already (quant_algo={algo}, "
                              f"group_size={q.get('group_size')})")
        return TrtllmQuantization(WEIGHTS_OF_ALGO.get(algo), algo, q.get("group_size"),
                                  "as stored" if has_drafter else None, source)
    if weights is None:
        if opts.block_size is not None:
            raise ConfigError(f"--block-size {opts.block_size}: applies to --weights int4 (INT4-AWQ groups)")
        return None
    if method is Method.REDRAFTER:  # TensorRT-LLM examples/redrafter/README.md: quantize the base, then convert onto it
        raise BuildError(f"--weights {weights}: TensorRT-LLM's {QUANTIZE_SCRIPT} takes no ReDrafter drafter; "
                         "upstream quantizes the base checkpoint first and converts the drafter onto it, which "
                         f"`trtspec convert` does not do yet; build {source} in {cfg.dtype}")
    if method is Method.EAGLE:
        raise BuildError(f"--weights {weights}: TensorRT-LLM's {QUANTIZE_SCRIPT} takes Medusa heads but no EAGLE "
                         "draft, so no upstream flow quantizes an EAGLE checkpoint's base and keeps its draft; build "
                         f"{source} in {cfg.dtype}, or quantize it on the CPU backend (--backend onnx --weights)")
    qformat, quant_algo = FORMATS[weights]
    group = None
    if weights == "int4":
        group = opts.block_size if opts.block_size is not None else DEFAULT_AWQ_BLOCK_SIZE
        if group not in AWQ_BLOCK_SIZES:
            raise ConfigError(f"--block-size {group}: INT4-AWQ groups of {' or '.join(map(str, AWQ_BLOCK_SIZES))} "
                              "(quantize.py --awq_block_size)")
    elif opts.block_size is not None:
        raise ConfigError(f"--block-size {opts.block_size}: applies to --weights int4 (INT4-AWQ groups)")
    provenance = _provenance(source, weights)
    out = Path(opts.out)
    checkpoint = out.with_name(f"{out.name}-{qformat}-ckpt")
    argv = ["python3", QUANTIZE_SCRIPT, "--model_dir", provenance["base"], "--dtype", cfg.dtype,
            "--qformat", qformat, "--output_dir", str(checkpoint), "--tp_size", str(tp), "--pp_size", str(pp),
            "--calib_size", str(CALIB_SIZE)]
    if group is not None:
        argv += ["--awq_block_size", str(group)]
    drafter = None
    if method is Method.MEDUSA:
        medusa = (provenance.get("options") or {}).get("medusa")
        if not medusa:
            raise BuildError(f"{source / PROVENANCE_FILE}: no Medusa heads folder recorded; quantize.py needs "
                             "--medusa_model_dir")
        argv += ["--medusa_model_dir", str(medusa), "--num_medusa_heads", str(cfg.num_medusa_heads),
                 "--num_medusa_layers", str(cfg.num_medusa_layers), "--max_draft_len", str(k)]
        if opts.quantize_heads:
            argv.append("--quant_medusa_head")
        drafter = "quantized" if opts.quantize_heads else cfg.dtype
    return TrtllmQuantization(weights, quant_algo, group, drafter, checkpoint, tuple(argv))


def quantization_notes(quant: TrtllmQuantization | None, dtype: str) -> list[str]:
    if quant is None:
        return []
    notes = []
    if quant.quantize_argv is not None:
        notes.append(f"quantize first (TensorRT Model Optimizer, calibrating on quantize.py's default dataset; a GPU "
                     f"host): {' '.join(quant.quantize_argv)}; trtllm-build then reads {quant.checkpoint}")
    if quant.drafter == dtype:
        notes.append(HEADS_NOTE.format(dtype=dtype))
    elif quant.drafter == "quantized":
        notes.append("--quantize-heads: the Medusa heads are quantized too (--quant_medusa_head), which upstream "
                     "builds have failed on: NVIDIA/TensorRT-LLM#2115 (FP8 heads), #1845 (weight-only)")
    return notes


def _provenance(source: Path, weights: str) -> dict:
    path = source / PROVENANCE_FILE
    if not path.is_file():
        raise BuildError(f"--weights {weights}: {source} is a float checkpoint without {PROVENANCE_FILE}, so the "
                         f"Hugging Face model {QUANTIZE_SCRIPT} quantizes from is unknown; run quantize.py on it "
                         "yourself and build from its --output_dir (or convert with `trtspec convert`)")
    from trtspec.checkpoint.hf_config import read_json

    provenance = read_json(path)
    if not provenance.get("base"):
        raise BuildError(f"{path}: no 'base' recorded; run quantize.py on the Hugging Face model yourself")
    return provenance
