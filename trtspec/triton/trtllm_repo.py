"""`trtspec deploy --flavour trtllm`: tensorrtllm_backend's `inflight_batcher_llm` layout for a TensorRT-LLM engine.

preprocessing → tensorrt_llm → postprocessing wired by `ensemble`, plus `tensorrt_llm_bls` (and
`tensorrt_llm_draft` for a draft-target pair). Every value comes from the manifest and the options: the configs
are rendered from data (`trtspec.triton.pbtxt`), so no `${…}` is ever left to fill. Each rule cites
the public upstream file it follows; `docs/upstream-sources.md` lists them.
"""

from __future__ import annotations

import json
import logging
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

from trtspec.engine.manifest import Backend, Manifest, Method, read_manifest
from trtspec.engine.resolve import DEFAULT_TREE
from trtspec.engine.trtllm_plan import DECODING_MODE, cpp_choices
from trtspec.engine.trtllm_versions import TrtllmVersion, parse_version
from trtspec.errors import RepositoryError
from trtspec.speculative.tree_presets import preset
from trtspec.triton import trtllm_tensors as tt
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.pbtxt import TritonModelConfig, Step, render

log = logging.getLogger(__name__)

MODELS_DIR = Path(__file__).parent / "trtllm_models"
CPU_ENGINE_MODEL = Path(__file__).parent / "python_models" / "tensorrt_llm.py"
LAUNCH_SCRIPT = "launch_triton.sh"
BATCHING_STRATEGIES = ("inflight_fused_batching", "inflight_batching", "V1")  # gpt_model_type (tensorrtllm_backend tensorrt_llm/config.pbtxt)


@dataclass(frozen=True)
class Context:
    """Everything the configs are rendered from, validated once."""

    manifest: Manifest
    version: TrtllmVersion
    batch: int  # Triton max_batch_size
    decoupled: bool
    engine_dir: Path  # absolute: gpt_model_path
    tokenizer_dir: Path
    logits_type: str
    instances: int
    batching_strategy: str
    kv_fraction: float
    queue_delay: int
    chat_template: bool
    draft: tuple[Manifest, Path] | None  # draft-target: the draft engine's manifest and absolute path
    rehearsal: Path | None = None  # --rehearse: the CPU engine that serves tensorrt_llm (absolute)
    rehearsal_draft: Path | None = None  # --rehearse-draft: the CPU engine that serves tensorrt_llm_draft (absolute)
    threads: int | None = None  # --rehearse: the CPU engine's ONNX Runtime threads
    spin: bool | None = None
    backoff: bool = True  # --rehearse: the CPU engine's drafts shrink or rest while they do not pay


def write_trtllm_repository(manifest: Manifest, options: DeployOptions, staging: Path, batch: int) -> None:
    """Write every model of the repository (and the launch script) into `staging` (options checked by
    check_options, batch: Triton's max_batch_size)."""
    ctx = _context(manifest, options, batch)
    configs = [preprocessing(ctx), tensorrt_llm(ctx), postprocessing(ctx), ensemble(ctx), bls(ctx)]
    if ctx.draft is not None:
        configs.append(tensorrt_llm(ctx, draft=True))
    sources = {"preprocessing": MODELS_DIR / "preprocessing.py", "postprocessing": MODELS_DIR / "postprocessing.py",
               "tensorrt_llm_bls": MODELS_DIR / "bls.py"}
    if ctx.rehearsal is not None:  # the CPU flavour's engine model, under the GPU model's name and tensors
        sources["tensorrt_llm"] = CPU_ENGINE_MODEL
    if ctx.rehearsal_draft is not None:
        sources["tensorrt_llm_draft"] = CPU_ENGINE_MODEL
    for config in configs:
        version_dir = staging / config.name / "1"
        version_dir.mkdir(parents=True)
        (staging / config.name / "config.pbtxt").write_text(render(config))
        if config.name in sources:
            shutil.copyfile(sources[config.name], version_dir / "model.py")
    if ctx.rehearsal is not None:  # served here by `trtspec serve`; a GPU host's launch script would start tensorrtllm
        return
    script = staging / LAUNCH_SCRIPT
    script.write_text(launch_script(ctx, Path(options.out).resolve()))
    script.chmod(0o755)


# ---- validation ---------------------------------------------------------------------------------------

def _context(manifest: Manifest, options: DeployOptions, batch: int) -> Context:
    where = Path(options.engine_dir) / "manifest.json"
    version = parse_version(manifest.versions.get("tensorrt_llm", ""))
    if manifest.tokenizer is None:
        raise RepositoryError(f"{where}: the engine has no tokenizer; preprocessing needs one, rebuild with "
                              "`trtspec build --tokenizer DIR`")
    if options.batching_strategy not in BATCHING_STRATEGIES:  # any other value throws at load (tensorrtllm_backend tensorrt_llm/config.pbtxt)
        raise RepositoryError(f"batching strategy {options.batching_strategy!r} is not one of "
                              f"{', '.join(BATCHING_STRATEGIES)}")
    if not 0 < options.kv_cache_free_gpu_mem_fraction <= 1:
        raise RepositoryError(f"--kv-cache-free-gpu-mem-fraction {options.kv_cache_free_gpu_mem_fraction} "
                              "must be in (0, 1]")
    _check_method_support(manifest, version, where)
    draft = _draft(manifest, options, version)
    decoupled = options.decoupled
    if manifest.method is Method.DRAFT_TARGET and decoupled:
        # tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md and tensorrt_llm_bls/1/lib/decode.py: the BLS draft-target loop never streams and the DTM README deploys every model with
        # decoupled_mode False; the three stay consistent.
        log.warning("draft-target decoding does not stream: writing decoupled false on tensorrt_llm, "
                    "tensorrt_llm_draft and tensorrt_llm_bls")
        decoupled = False
    engine_dir = Path(options.engine_dir).resolve()
    rehearsal = rehearsal_engine(manifest, options, draft=draft)
    return Context(manifest=manifest, version=version, batch=batch, decoupled=decoupled, rehearsal=rehearsal,
                   rehearsal_draft=Path(options.rehearse_draft).resolve() if rehearsal and draft else None,
                   threads=options.threads, spin=options.spin, backoff=options.backoff,
                   engine_dir=engine_dir, tokenizer_dir=engine_dir / manifest.tokenizer,
                   logits_type=tt.LOGITS_TYPES.get(manifest.model.logits_dtype, "TYPE_FP32"),
                   instances=options.instances, batching_strategy=options.batching_strategy,
                   kv_fraction=options.kv_cache_free_gpu_mem_fraction,
                   queue_delay=options.max_queue_delay_microseconds, chat_template=options.chat_template, draft=draft)


def rehearsal_engine(manifest: Manifest, options: DeployOptions, *,
                     draft: tuple[Manifest, Path] | None) -> Path | None:
    """--rehearse CPU_ENGINE: the onnx engine of the same checkpoint that serves the repository's tensorrt_llm model
    here (trtspec's CPU engine model, which speaks tensorrt_llm's tensors), checked against the TensorRT-LLM engine
    it stands in for: the same method, tree, vocabulary and tokenizer-given end id. A lookahead engine's stand-in is
    a plain CPU engine with as many draft slots (lookahead is a request-level method on the CPU). A draft-target
    pair needs two: --rehearse for the target (plain, verifying the BLS loop's drafts sent as draft_input_ids) and
    --rehearse-draft for the draft (plain). A stand-in deployed non-decoupled (`--no-decoupled`, and always both of
    a draft-target pair, as the BLS calls them) answers each request in one response."""
    if options.rehearse is None:
        return None
    path = Path(options.rehearse)
    cpu = _rehearsal_manifest(path)
    where = path / "manifest.json"
    if draft is not None:
        if options.rehearse_draft is None:
            raise RepositoryError("--rehearse: a draft-target pair needs the draft's CPU engine too "
                                  "(--rehearse-draft CPU_ENGINE, the draft checkpoint built with `trtspec build`)")
        _check_stand_in(_rehearsal_manifest(Path(options.rehearse_draft)), draft[0],
                        Path(options.rehearse_draft) / "manifest.json")
        # the first draft token is checked against the prefill's own, the other max_draft_len - 1 in one verify
        needed = max(manifest.profile.max_draft_len - 1, 0)
        if cpu.profile.max_draft_len < needed:
            raise RepositoryError(f"{where}: max_draft_len {cpu.profile.max_draft_len}, but the target verifies "
                                  f"{manifest.profile.max_draft_len} drafted tokens a step; build the CPU engine "
                                  f"with --no-spec --max-draft-len {needed} or more")
        _check_stand_in(cpu, manifest, where, method="none")
        return path.resolve()
    if options.rehearse_draft is not None:
        raise RepositoryError(f"--rehearse-draft: {options.engine_dir} is a {manifest.method.value} engine, not a "
                              "draft-target pair")
    lookahead = manifest.method is Method.LOOKAHEAD
    if lookahead and cpu.profile.max_draft_len < manifest.profile.max_draft_len:
        raise RepositoryError(f"{where}: max_draft_len {cpu.profile.max_draft_len}, but the lookahead engine drafts "
                              f"{manifest.profile.max_draft_len} a step; build the CPU engine with --max-draft-len "
                              f"{manifest.profile.max_draft_len}")
    _check_stand_in(cpu, manifest, where, method="none" if lookahead else manifest.method.value)
    if manifest.tree and cpu.tree and tuple(map(tuple, manifest.tree)) != tuple(map(tuple, cpu.tree)):
        gpu_tree = json.dumps([list(c) for c in manifest.tree], separators=(",", ":"))
        raise RepositoryError(f"{where}: its tree differs from the TensorRT-LLM engine's; build the CPU engine with "
                              f"--choices '{gpu_tree}' (the TensorRT-LLM engine's)")
    return path.resolve()


def _rehearsal_manifest(path: Path) -> Manifest:
    cpu = read_manifest(path)
    if cpu.backend is not Backend.ONNX:
        raise RepositoryError(f"--rehearse {path}: a CPU (onnx) engine is needed, found a {cpu.backend.value} engine; "
                              "build the same checkpoint with `trtspec build CKPT --out DIR`")
    return cpu


def _check_stand_in(cpu: Manifest, gpu: Manifest, where: Path, method: str = "none") -> None:
    """The CPU engine decodes what the TensorRT-LLM engine would: the same method, vocabulary and end id."""
    for what, gpu_value, cpu_value in (("method", method, cpu.method.value),
                                       ("vocab_size", gpu.model.vocab_size, cpu.model.vocab_size),
                                       ("end_id", gpu.model.end_id, cpu.model.end_id)):
        if gpu_value != cpu_value:
            raise RepositoryError(f"{where}: {what} {cpu_value!r}, but the TensorRT-LLM engine's is {gpu_value!r}; "
                                  "rehearse with the CPU engine of the same checkpoint and drafter")


def _check_method_support(manifest: Manifest, version: TrtllmVersion, where: Path) -> None:
    method = manifest.method
    if method is Method.LOOKAHEAD and not version.has_lookahead_parameters:
        raise RepositoryError(f"{where}: lookahead on Triton needs the tensorrt_llm model's lookahead_* parameters, "
                              f"which TensorRT-LLM {version.text} lacks (added in 0.19); rebuild with "
                              "`trtspec build --backend trtllm --trtllm-version 0.19` or newer")
    if method is Method.EAGLE and not version.has_eagle_choices and manifest.tree != _default_tree():
        raise RepositoryError(f"{where}: TensorRT-LLM {version.text} has no eagle_choices parameter (0.16+), so the "
                              f"server would run {DEFAULT_TREE[Backend.TRTLLM]}, not this engine's tree; rebuild with "
                              "`trtspec build --backend trtllm --trtllm-version 0.17` or newer")
    if method in (Method.MEDUSA, Method.EAGLE) and not manifest.tree:
        raise RepositoryError(f"{where}: a {method.value} engine's manifest lists no tree")
    if method is Method.LOOKAHEAD and not manifest.lookahead:
        raise RepositoryError(f"{where}: a lookahead engine's manifest lists no (W, N, G)")


def _default_tree() -> tuple[tuple[int, ...], ...]:
    from trtspec.speculative.tree import build_tree

    return build_tree(preset(DEFAULT_TREE[Backend.TRTLLM])).choices


def _draft(manifest: Manifest, options, version: TrtllmVersion) -> tuple[Manifest, Path] | None:
    draft_dir = getattr(options, "draft_engine_dir", None)
    if manifest.method is not Method.DRAFT_TARGET:
        if draft_dir is not None:
            raise RepositoryError(f"--draft-engine needs a draft-target engine; {options.engine_dir} is a "
                                  f"{manifest.method.value} engine (build the target with "
                                  "`trtspec build --draft-target`)")
        return None
    if draft_dir is None:
        raise RepositoryError(f"{options.engine_dir} is a draft-target engine: pass --draft-engine DIR, the draft "
                              "model's engine (`trtspec build --backend trtllm` on the draft checkpoint)")
    draft = read_manifest(Path(draft_dir))
    where = Path(draft_dir) / "manifest.json"
    if draft.backend is not Backend.TRTLLM or draft.method is not Method.NONE:
        raise RepositoryError(f"{where}: the draft engine must be a plain trtllm engine, found "
                              f"{draft.backend.value} / {draft.method.value}")
    if draft.model.vocab_size != manifest.model.vocab_size:
        raise RepositoryError(f"{where}: the draft's vocab_size {draft.model.vocab_size} differs from the target's "
                              f"{manifest.model.vocab_size}; draft and target must share a tokenizer")
    draft_version = parse_version(draft.versions.get("tensorrt_llm", ""))
    if draft_version.key != version.key:
        raise RepositoryError(f"{where}: the draft was built by TensorRT-LLM {draft_version.text}, the target by "
                              f"{version.text}; one server runs one version, rebuild the draft")
    return draft, Path(draft_dir).resolve()


# ---- the models ---------------------------------------------------------------------------------------

def preprocessing(ctx: Context) -> TritonModelConfig:
    model = ctx.manifest.model
    # vocab_size: EMBEDDING_BIAS must be [vocab] of the engine's logits (TensorRT-LLM's decoder checks "Expected last
    # dimension to be same as vocab size"), which the tokenizer's own size need not be
    params = {"tokenizer_dir": str(ctx.tokenizer_dir), "add_special_tokens": "true",
              "apply_chat_template": _bool(ctx.chat_template), "vocab_size": str(model.vocab_size)}
    params.update({k: str(v) for k, v in (("end_id", model.end_id), ("pad_id", model.pad_id)) if v is not None})
    batching = {"preferred_batch_size": [ctx.batch], "max_queue_delay_microseconds": ctx.queue_delay} \
        if ctx.version.has_preprocessing_batching else None
    return TritonModelConfig(name="preprocessing", backend="python", max_batch_size=ctx.batch,
                       inputs=tt.preprocessing_inputs(), outputs=tt.preprocessing_outputs(),
                       dynamic_batching=batching, instance_count=ctx.instances, parameters=params)


def postprocessing(ctx: Context) -> TritonModelConfig:
    return TritonModelConfig(name="postprocessing", backend="python", max_batch_size=ctx.batch,
                       inputs=tt.postprocessing_inputs(), outputs=tt.postprocessing_outputs(), dynamic_batching={},
                       instance_count=ctx.instances,
                       parameters={"tokenizer_dir": str(ctx.tokenizer_dir), "skip_special_tokens": "true"})


def tensorrt_llm(ctx: Context, *, draft: bool = False) -> TritonModelConfig:
    """The engine model (C++ backend); with draft=True the draft-target pair's draft engine."""
    manifest, engine_dir = ctx.draft if draft else (ctx.manifest, ctx.engine_dir)
    batch = min(ctx.batch, manifest.profile.max_batch_size)
    kv_fraction = ctx.kv_fraction / 2 if ctx.draft is not None else ctx.kv_fraction  # two engines, one GPU (tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md)
    params = {"max_beam_width": "1",  # beam search is incompatible with every draft method (TensorRT-LLM tensorrt_llm/builder.py)
              "FORCE_CPU_ONLY_INPUT_TENSORS": "no", "gpt_model_type": ctx.batching_strategy,
              "gpt_model_path": str(engine_dir), "batch_scheduler_policy": "guaranteed_no_evict",
              "kv_cache_free_gpu_mem_fraction": f"{kv_fraction:g}", "decoding_mode": DECODING_MODE[manifest.method]}
    params.update(_speculative_parameters(manifest, ctx.version))
    if ctx.draft is not None:  # both models of the pair resend the whole sequence each step (tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md)
        params["enable_kv_cache_reuse"] = "true"
    stand_in = ctx.rehearsal_draft if draft else ctx.rehearsal
    if stand_in is not None:
        # the same inputs, outputs and parameters, run by trtspec's CPU engine model (Python backend) over the CPU
        # engine: what the GPU host's tensorrtllm backend reads stays in the file, unread here
        params.update({"engine_dir": str(stand_in), "threads": str(ctx.threads or 0),
                       "exclude_input_in_output": "false",
                       "spin": {None: "auto", True: "true", False: "false"}[ctx.spin],
                       "method": "lookahead" if manifest.method is Method.LOOKAHEAD else "auto",
                       "datastore": "", "backoff": _bool(ctx.backoff)})
        return TritonModelConfig(name="tensorrt_llm_draft" if draft else "tensorrt_llm", backend="python",
                                 max_batch_size=batch, decoupled=ctx.decoupled,
                                 dynamic_batching={}, inputs=tt.llm_inputs(ctx.version, ctx.logits_type),
                                 outputs=tt.llm_outputs(ctx.version, ctx.logits_type), instance_count=1,
                                 parameters=params)
    return TritonModelConfig(name="tensorrt_llm_draft" if draft else "tensorrt_llm", backend="tensorrtllm",
                       max_batch_size=batch, decoupled=ctx.decoupled,
                       dynamic_batching={"preferred_batch_size": [batch],
                                         "max_queue_delay_microseconds": ctx.queue_delay},
                       inputs=tt.llm_inputs(ctx.version, ctx.logits_type),
                       outputs=tt.llm_outputs(ctx.version, ctx.logits_type),
                       instance_count=1,  # one executor per model; more need gpu_device_ids groups (tensorrtllm_backend tensorrt_llm/config.pbtxt)
                       parameters=params)


def _speculative_parameters(manifest: Manifest, version: TrtllmVersion) -> dict[str, str]:
    if manifest.method is Method.MEDUSA:
        # C++ brace syntax: Python [[...]] is silently replaced by mc_sim_7b_63 (tensorrtllm_backend tensorrt_llm/config.pbtxt); XQA multi-block
        # mode is off for Medusa / EAGLE, as ModelRunnerCpp sets it (TensorRT-LLM tensorrt_llm/builder.py)
        return {"medusa_choices": cpp_choices(manifest.tree), "multi_block_mode": "false"}
    if manifest.method is Method.EAGLE:
        out = {"multi_block_mode": "false"}
        if version.has_eagle_choices:
            out["eagle_choices"] = cpp_choices(manifest.tree)
        return out
    if manifest.method is Method.LOOKAHEAD:  # required with decoding_mode lookahead; must give K exactly (tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md)
        return {f"lookahead_{k}": str(v) for k, v in manifest.lookahead.items()}
    return {}


def ensemble(ctx: Context) -> TritonModelConfig:
    inputs, outputs = tt.ensemble_inputs(ctx.version), tt.ensemble_outputs(ctx.version, ctx.logits_type)
    # upstream's wiring (tensorrtllm_backend ensemble/config.pbtxt): embedding bias words / weights, the decoder
    # query and the prompt-table extra id through preprocessing; LoRA, prompt tuning and guided decoding straight
    # to tensorrt_llm, whose C++ backend honours (or refuses) them itself
    names = {t.name for t in inputs}
    pre = Step("preprocessing", {target: source for source, target in tt.GPU_CLIENT_TO_PRE.items() if source in names},
               {out: internal for out, (internal, _) in tt.GPU_PRE_TO_LLM.items()})
    llm_in = {llm: internal for internal, llm in tt.GPU_PRE_TO_LLM.values()}
    llm_in.update({tt.client_to_llm_name(t.name): t.name for t in inputs if tt.client_to_llm_name(t.name)})
    # output_ids goes to postprocessing and to the client as tensorrt_llm sends it, [1, beams, L]
    llm_out = {"output_ids": "output_ids", "sequence_length": "_SEQUENCE_LENGTH"}
    llm_out.update({name: name for name in ("cum_log_probs", "output_log_probs", "context_logits",
                                           "generation_logits", "batch_index", "sequence_index")})
    # upstream's names (trtspec's client reads total_* as its acceptance counters)
    llm_out.update({t.name: t.name for t in tt.perf_metric_outputs(ctx.version)})
    # postprocessing reads only tensorrt_llm's outputs: mixing in preprocessing's fails when the LLM step is
    # decoupled (tensorrtllm_backend ensemble/config.pbtxt, server#7275)
    post = Step("postprocessing", {"TOKENS_BATCH": "output_ids", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
                {"OUTPUT": "text_output"})
    return TritonModelConfig(name="ensemble", platform="ensemble", max_batch_size=ctx.batch, inputs=inputs,
                       outputs=outputs, steps=(pre, Step("tensorrt_llm", llm_in, llm_out), post))


def bls(ctx: Context) -> TritonModelConfig:
    params = {"tensorrt_llm_model_name": "tensorrt_llm", "tensorrt_llm_decoupled": _bool(ctx.decoupled),
              "max_draft_len": str(ctx.manifest.profile.max_draft_len)}
    if ctx.draft is not None:
        params["tensorrt_llm_draft_model_name"] = "tensorrt_llm_draft"
    # one request at a time per instance: as many instances as the batch (tensorrtllm_backend tensorrt_llm_bls/config.pbtxt)
    return TritonModelConfig(name="tensorrt_llm_bls", backend="python", max_batch_size=ctx.batch, decoupled=ctx.decoupled,
                       inputs=tt.bls_inputs(ctx.version), outputs=tt.bls_outputs(ctx.version, ctx.logits_type),
                       instance_count=ctx.batch, parameters=params)


def launch_script(ctx: Context, repo: Path) -> str:
    """tritonserver for one rank, or MPI leader mode with one rank per GPU (tensorrtllm_backend inflight_batcher_llm/client/ launch_triton_server.py)."""
    world = ctx.manifest.world_size
    llm_models = ["tensorrt_llm"] + (["tensorrt_llm_draft"] if ctx.draft is not None else [])
    ports = ['--grpc-port="$GRPC_PORT"', '--http-port="$HTTP_PORT"', '--metrics-port="$METRICS_PORT"']
    ranks = []
    for rank in range(world):
        cmd = ["-n", "1", "tritonserver", f"--model-repository={shlex.quote(str(repo))}"]
        if rank:  # ranks > 0 only host their engine shard (leader mode)
            cmd += ["--model-control-mode=explicit"] + [f"--load-model={m}" for m in llm_models]
        cmd += ports + ["--disable-auto-complete-config",
                        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_"]
        ranks.append(" ".join(cmd))
    body = (f"exec {ranks[0].removeprefix('-n 1 ')}" if world == 1
            else "exec mpirun --allow-run-as-root \\\n  " + " \\\n  : ".join(ranks))
    return (f"#!/usr/bin/env bash\n# Written by trtspec deploy: serve {repo.name} ({ctx.manifest.method.value}, "
            f"TensorRT-LLM {ctx.version.text}, world_size {world}: one MPI rank per GPU).\n"
            f"# Run inside {ctx.version.container or 'the Triton TensorRT-LLM container of that version'}.\n"
            f"set -euo pipefail\n"
            "GRPC_PORT=$(printenv GRPC_PORT || echo 8001)\nHTTP_PORT=$(printenv HTTP_PORT || echo 8000)\n"
            "METRICS_PORT=$(printenv METRICS_PORT || echo 8002)\n"
            f"{body}\n")


def _bool(value: bool) -> str:
    return "true" if value else "false"
