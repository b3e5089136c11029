"""What `trtspec deploy` is asked for (DeployOptions) and the checks of those options against the engine's manifest.

The one place they are checked: `deploy` runs check_options once and hands the writers (`cpu_repo`, `trtllm_repo`)
the result; the engine model checks a request's `draft_method` with check_method. Imports nothing of `deploy` or
the writers, so the dependency runs one way: deploy → writers → deploy_options.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.engine.manifest import Backend, Manifest
from trtspec.errors import ConfigError

FLAVOURS = ("cpu", "trtllm")


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
    force: bool = False
    # trtllm flavour knobs (the tensorrt_llm model's parameters)
    batching_strategy: str = "inflight_fused_batching"
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_queue_delay_microseconds: int = 0
    draft_engine_dir: Path | None = None  # trtllm flavour, draft-target: the draft model's engine (tensorrt_llm_draft)


def resolve_flavour(manifest: Manifest, flavour: str | None) -> str:
    default = "trtllm" if manifest.backend is Backend.TRTLLM else "cpu"
    flavour = flavour or default
    if flavour not in FLAVOURS:
        raise ConfigError(f"--flavour {flavour!r} is not one of {', '.join(FLAVOURS)}")
    if flavour == "cpu" and manifest.backend is not Backend.ONNX:
        raise ConfigError(f"--flavour cpu needs an onnx engine; the manifest's backend is {manifest.backend.value!r}")
    if flavour == "trtllm" and manifest.backend is not Backend.TRTLLM:
        raise ConfigError(f"--flavour trtllm needs a trtllm engine; the manifest's backend is "
                          f"{manifest.backend.value!r} (build with --backend trtllm)")
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
    if not options.backoff and manifest.backend is not Backend.ONNX:
        raise ConfigError("--no-backoff applies to the CPU flavour only (a TensorRT-LLM engine drafts its whole tree "
                          "every step)")
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
