"""What `trtspec deploy` is asked for (DeployOptions) and the checks of those options against the engine's manifest.

The one place they are checked: `deploy` runs check_options once and hands the writers (`cpu_repo`, `trtllm_repo`)
the result; the engine model checks a request's `draft_method` with check_method. Imports nothing of `deploy` or
the writers, so the dependency runs one way: deploy → writers → deploy_options. The llmapi flavour deploys a
Hugging Face folder, not an engine: LlmapiOptions and check_llmapi_options are its counterparts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.engine.manifest import Backend, Manifest
from trtspec.errors import ConfigError

FLAVOURS = ("cpu", "trtllm")  # the engine flavours; "llmapi" deploys a Hugging Face folder (LlmapiOptions)


@dataclass(frozen=True, kw_only=True)
class DeployOptions:
    engine_dir: Path
    out: Path
    flavour: str | None = None  # default: cpu for an onnx engine, trtllm for a trtllm engine
    instances: int = 1  # engine model instances (CPU flavour: each hosts its own sessions and batcher)
    max_batch_size: int | None = None  # Triton max_batch_size; default and upper bound: the engine profile's
    decoupled: bool = True  # streaming responses (gRPC bidirectional stream); required for stream=true
    # preprocessing renders text_input through the tokenizer's chat template for requests that send no
    # apply_chat_template (off, as upstream: the prompt is the client's text)
    chat_template: bool = False
    copy_engine: bool = False  # CPU flavour: copy the engine into the repository (fully self-contained)
    threads: int | None = None  # CPU flavour: ONNX Runtime intra-op threads per engine instance
    spin: bool | None = None  # CPU flavour: intra-op workers spin between ops (None: the engine's rule on the
    # server, model_args.served_spin: spin unless TRTSPEC_ORT_SPIN=0)
    method: str | None = None  # CPU flavour: the drafter requests get (none / ngram / suffix / the engine's own)
    datastore: Path | None = None  # CPU flavour: the corpus of method suffix (`trtspec datastore build`)
    backoff: bool = True  # CPU flavour: Medusa / EAGLE / lookahead drafts shrink or rest while they do not pay
    draft_budget: int | None = None  # CPU flavour: training-free drafters' tokens per step (None: the engine's K)
    force: bool = False
    # trtllm flavour knobs (the tensorrt_llm model's parameters)
    batching_strategy: str = "inflight_fused_batching"
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_queue_delay_microseconds: int = 0
    draft_engine_dir: Path | None = None  # trtllm flavour, draft-target: the draft model's engine (tensorrt_llm_draft)
    # trtllm flavour: a CPU (onnx) engine of the same checkpoint and method that serves the tensorrt_llm model under its
    # GPU tensor contract, so the GPU repository runs in this host's tritonserver (trtllm_repo.rehearsal_engine)
    rehearse: Path | None = None
    rehearse_draft: Path | None = None  # --rehearse of a draft-target pair: the draft's CPU engine (tensorrt_llm_draft)


def resolve_flavour(manifest: Manifest, flavour: str | None) -> str:
    default = "trtllm" if manifest.backend is Backend.TRTLLM else "cpu"
    flavour = flavour or default
    if flavour == "llmapi":
        raise ConfigError("--flavour llmapi deploys a Hugging Face folder with --hf DIR, not an engine (TensorRT-LLM's "
                          "LLM API builds nothing ahead of time); drop the ENGINE argument")
    if flavour not in FLAVOURS:
        raise ConfigError(f"--flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
    if flavour == "cpu" and manifest.backend is not Backend.ONNX:
        raise ConfigError(f"--flavour cpu needs an onnx engine; the manifest's backend is {manifest.backend.value!r}")
    if flavour == "trtllm" and manifest.backend is not Backend.TRTLLM:
        raise ConfigError(f"--flavour trtllm needs a trtllm engine; the manifest's backend is "
                          f"{manifest.backend.value!r} (build one with `trtspec build CKPT --backend trtllm`)")
    return flavour


def check_options(manifest: Manifest, options: DeployOptions) -> int:
    """Validate the options against the manifest; return the Triton max_batch_size to write."""
    engine_batch = manifest.profile.max_batch_size
    batch = options.max_batch_size if options.max_batch_size is not None else engine_batch
    if batch < 1:
        raise ConfigError(f"--max-batch-size must be >= 1, got {batch}")
    if batch > engine_batch:
        raise ConfigError(f"--max-batch-size {batch} exceeds the engine's max_batch_size {engine_batch} "
                          f"({options.engine_dir / 'manifest.json'})")
    if options.instances < 1:
        raise ConfigError(f"--instances must be >= 1, got {options.instances}")
    if options.method is not None:
        check_method(manifest, options.method)
    if options.datastore is not None:
        check_datastore(manifest, Path(options.engine_dir), Path(options.datastore))
    if options.draft_budget is not None:
        if manifest.backend is not Backend.ONNX:
            raise ConfigError("--draft-budget applies to the CPU flavour only (a TensorRT-LLM engine drafts what it "
                              "was built for)")
        from trtspec.speculative.methods import check_draft_budget

        check_draft_budget(options.draft_budget, manifest.profile.max_draft_len, "--draft-budget")
    if not options.backoff and manifest.backend is not Backend.ONNX and options.rehearse is None:
        raise ConfigError("--no-backoff applies to the CPU flavour only (a TensorRT-LLM engine drafts its whole tree "
                          "every step)")
    if options.rehearse_draft is not None and options.rehearse is None:
        raise ConfigError("--rehearse-draft stands in for the draft of a rehearsed draft-target pair: give the "
                          "target's CPU engine with --rehearse too")
    if options.rehearse is not None and manifest.backend is not Backend.TRTLLM:
        raise ConfigError("--rehearse serves a TensorRT-LLM repository's tensorrt_llm model with a CPU engine: deploy a "
                          "trtllm engine (or its plan, `build --backend trtllm --plan-only`) with --flavour trtllm")
    return batch


def check_datastore(manifest: Manifest, engine_dir: Path, path: Path) -> None:
    """`--datastore`: a readable, intact store tokenized for this engine (CPU flavour)."""
    if manifest.backend is not Backend.ONNX:
        raise ConfigError("--datastore applies to the CPU flavour only (TensorRT-LLM has no suffix drafter)")
    if manifest.profile.max_draft_len < 1:
        raise ConfigError("--datastore: method suffix needs an engine built with --max-draft-len K >= 1")
    from trtspec.runtime.tokenizer import tokenizer_fingerprint
    from trtspec.speculative.datastore import Datastore

    fingerprint = tokenizer_fingerprint(engine_dir / manifest.tokenizer) if manifest.tokenizer else ""
    Datastore.load(path).check_engine(manifest.model.vocab_size, fingerprint, where="--datastore")


def check_method(manifest: Manifest, method: str, what: str = "--method") -> None:
    """`--method` (or a request's `draft_method`): a drafter the engine can run, checked before anything runs."""
    from trtspec.speculative.method import TRAINING_FREE, Method

    if manifest.backend is not Backend.ONNX:
        raise ConfigError(f"{what} applies to the CPU flavour only (a TensorRT-LLM engine runs the method it was "
                          "built for)")
    own = manifest.method.value
    Method.expect(method, Method.decoded_on_cpu(), what)
    if method in TRAINING_FREE and manifest.profile.max_draft_len < 1:
        raise ConfigError(f"{what} {method}: the engine was built with max_draft_len 0; rebuild it with "
                          "--max-draft-len K (e.g. 16)")
    if method == "lookahead" and manifest.profile.max_draft_len < 2:
        raise ConfigError(f"{what} lookahead: the engine was built with max_draft_len "
                          f"{manifest.profile.max_draft_len}; its smallest step, (W, N, G) = 2,2,1, drafts 2")
    if method == "lookahead" and manifest.chains_only:
        raise ConfigError(f"{what} lookahead: {manifest.name} has quantized weights, whose verify steps compute only "
                          "chains exactly like plain steps, and lookahead verifies a tree; use ngram or suffix")
    runs = manifest.runnable_methods()
    if method not in runs:
        raise ConfigError(f"{what} {method}: the engine was built for {own} ({manifest.name}); it runs "
                          f"{', '.join(runs[:-1])} or {runs[-1]}")


# ---- the llmapi flavour (TensorRT-LLM's LLM API, PyTorch backend) ------------------------------------------------

DRAFTERS = ("eagle3", "mtp", "ngram", "draft_target")
DECODING_TYPES = {"eagle3": "Eagle3", "mtp": "MTP", "ngram": "NGram", "draft_target": "DraftTarget"}


@dataclass(frozen=True, kw_only=True)
class LlmapiOptions:
    """`trtspec deploy --flavour llmapi`: a Hugging Face base (+ drafter) → model.yaml for the LLM API."""

    hf_dir: Path  # the HF base folder (read here: config.json)
    out: Path
    trtllm_version: str | None = None  # default: the newest version the table holds
    drafter: str | None = None  # eagle3 / mtp / ngram / draft_target (None: plain decoding)
    draft_dir: Path | None = None  # eagle3: the EAGLE-3 draft; draft_target: the draft model
    model_path: str | None = None  # `model` as the GPU host sees it (default: hf_dir, absolute)
    draft_path: str | None = None  # `speculative_model` as the GPU host sees it (default: draft_dir, absolute)
    max_draft_len: int | None = None  # K (MTP: num_nextn_predict_layers, default the base's)
    max_total_draft_tokens: int | None = None
    dynamic_tree_top_k: int | None = None  # use_dynamic_tree with dynamic_tree_max_topK
    max_concurrency: int | None = None  # speculation off above this many requests
    # draft length by batch size: ((threshold, draft_len), ...), sorted (parse_draft_len_schedule)
    draft_len_schedule: tuple[tuple[int, int], ...] | None = None
    max_matching_ngram_size: int | None = None  # ngram
    speculative_options: tuple[str, ...] = ()  # further speculative_config KEY=VALUE (YAML values)
    max_batch_size: int = 64  # LLM max_batch_size (Triton's stays 0: the LLM batches in flight)
    max_num_tokens: int = 8192
    kv_cache_free_gpu_mem_fraction: float = 0.9
    kv_cache_reuse: bool = True  # kv_cache_config.enable_block_reuse
    decoupled: bool = True
    force: bool = False


def check_llmapi_options(options: LlmapiOptions) -> None:
    """The checks that need no file: numbers in range, the drafter's inputs present."""
    drafter = options.drafter
    if drafter is not None and drafter not in DRAFTERS:
        raise ConfigError(f"drafter {drafter!r} is not one of {', '.join(DRAFTERS)}")
    needs_dir = drafter in ("eagle3", "draft_target")
    if needs_dir and options.draft_dir is None:
        raise ConfigError(f"{'--eagle3' if drafter == 'eagle3' else '--draft-model'} needs the draft's folder")
    if not needs_dir and options.draft_dir is not None:
        raise ConfigError("a draft folder applies to --eagle3 or --draft-model only")
    if drafter is None and (options.max_draft_len is not None or options.speculative_options
                            or options.draft_len_schedule is not None or options.max_concurrency is not None):
        raise ConfigError("--max-draft-len / --draft-len-schedule / --max-concurrency / --speculative-option need a "
                          "drafter: --eagle3 DIR, --mtp, --ngram or --draft-model DIR")
    for flag, value, low in (("--max-draft-len", options.max_draft_len, 1),
                             ("--max-total-draft-tokens", options.max_total_draft_tokens, 1),
                             ("--dynamic-tree", options.dynamic_tree_top_k, 1),
                             ("--max-concurrency", options.max_concurrency, 1),
                             ("--max-matching-ngram-size", options.max_matching_ngram_size, 1),
                             ("--max-batch-size", options.max_batch_size, 1),
                             ("--max-num-tokens", options.max_num_tokens, 1)):
        if value is not None and value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    if options.max_num_tokens < options.max_batch_size:
        raise ConfigError(f"--max-num-tokens {options.max_num_tokens} is below --max-batch-size "
                          f"{options.max_batch_size}: every scheduled request needs at least one token a step")
    if not 0 < options.kv_cache_free_gpu_mem_fraction <= 1:
        raise ConfigError(f"--kv-cache-free-gpu-mem-fraction {options.kv_cache_free_gpu_mem_fraction} must be in "
                          "(0, 1]")
    for flag, value in (("--dynamic-tree", options.dynamic_tree_top_k),
                        ("--max-total-draft-tokens", options.max_total_draft_tokens)):
        if value is not None and drafter not in ("eagle3", "mtp"):
            raise ConfigError(f"{flag} applies to --eagle3 and --mtp (the tree-drafting methods)")
    if options.max_matching_ngram_size is not None and drafter != "ngram":
        raise ConfigError("--max-matching-ngram-size applies to --ngram")
    parse_speculative_options(options.speculative_options)


def parse_draft_len_schedule(text: str) -> tuple[tuple[int, int], ...]:
    """`--draft-len-schedule 1:4,4:2,8:0` → ((1, 4), (4, 2), (8, 0)), sorted by batch size; one line naming a
    malformed item. What each pair means and which schedules TensorRT-LLM takes: check_draft_len_schedule."""
    pairs = {}
    for item in text.split(","):
        size, sep, length = item.strip().partition(":")
        try:
            pairs[int(size)] = int(length)
        except ValueError:
            raise ConfigError(f"--draft-len-schedule {text!r}: write BATCH:DRAFT_LEN pairs, e.g. 1:4,4:2,8:0 "
                              f"({item.strip()!r} is not one)") from None
        if not sep:
            raise ConfigError(f"--draft-len-schedule {text!r}: write BATCH:DRAFT_LEN pairs, e.g. 1:4,4:2,8:0")
    return tuple(sorted(pairs.items()))


def check_draft_len_schedule(schedule, max_draft_len: int, what: str = "--draft-len-schedule") -> None:
    """TensorRT-LLM's rules for `speculative_config.draft_len_schedule` (tensorrt_llm/llmapi/llm_args.py,
    DecodingBaseConfig.validate_draft_len_schedule_and_sort): thresholds >= 1, draft lengths >= 0 and <= max_draft_len,
    and an entry for batch size 1 equal to max_draft_len. At run time a batch of n requests drafts the length of the
    largest threshold <= n (tensorrt_llm/_torch/speculative/drafter.py, get_draft_len_for_batch_size); 0 turns
    speculation off."""
    schedule = dict(schedule)
    for size, length in schedule.items():
        if size < 1:
            raise ConfigError(f"{what}: batch size {size} must be >= 1")
        if not 0 <= length <= max_draft_len:
            raise ConfigError(f"{what}: draft length {length} (batch size {size}) must be in 0..{max_draft_len} "
                              "(max_draft_len)")
    if schedule.get(1) != max_draft_len:
        raise ConfigError(f"{what}: TensorRT-LLM needs an entry for batch size 1 equal to max_draft_len "
                          f"({max_draft_len}); add 1:{max_draft_len}" if 1 not in schedule else
                          f"{what}: batch size 1 drafts {schedule[1]}, but TensorRT-LLM needs it equal to "
                          f"max_draft_len ({max_draft_len}); set --max-draft-len {schedule[1]} or 1:{max_draft_len}")


def parse_speculative_options(items: tuple[str, ...]) -> dict:
    """KEY=VALUE items (VALUE read as YAML: 4, true, [1, 2]) → a dict; one line naming a malformed item."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ConfigError(f"--speculative-option {item!r}: write KEY=VALUE, e.g. max_concurrency=8")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"--speculative-option {item!r}: the value is not YAML ({str(e).splitlines()[0]})") \
                from None
    return out
