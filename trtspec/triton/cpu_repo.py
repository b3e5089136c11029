"""The CPU flavour's model repository: preprocessing → tensorrt_llm (the trtspec runtime on ONNX Runtime) →
postprocessing, wired by an `ensemble` that exposes the client contract of `trtspec.triton.contract`, and
`tensorrt_llm_bls` with upstream's BLS interface (relaying to the ensemble).

The engine model keeps tensorrtllm_backend's name and tensor names (a client that talks to `tensorrt_llm`
directly works too); it is decoupled by default (streaming, in-flight batching across requests). The tokenizer
is copied into the pre- and postprocessing models; the engine is referenced by a path relative to the repository
(or copied into it with `--copy-engine`), so the repository plus the engine dir can move to another machine.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from trtspec.engine.manifest import Manifest
from trtspec.errors import RepositoryError
from trtspec.triton.contract import (CLIENT_TO_LLM, CLIENT_TO_PRE, LOOKAHEAD_INPUTS, NEVER_FILLED_OUTPUTS,
                                     PERF_METRIC_OUTPUTS, PRE_TO_LLM, cpu_ensemble_inputs, cpu_ensemble_outputs,
                                     tensor as _t)
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.pbtxt import TritonModelConfig, Step, render

MODEL_SOURCES = Path(__file__).parent / "python_models"
ENGINE_MODEL = "tensorrt_llm"
# `--no-decoupled`: the engine runs decoupled under this name and `tensorrt_llm` is a unary forwarder to it
# (python_models/unary_forwarder.py), so unary requests are batched in flight too
UNARY_ENGINE_MODEL = "trtspec_engine"


PRE_INPUTS = (_t("QUERY", "TYPE_STRING", optional=False), _t("DECODER_QUERY", "TYPE_STRING"),
              _t("REQUEST_OUTPUT_LEN", "TYPE_INT32", optional=False),
              _t("BAD_WORDS_DICT", "TYPE_STRING", (-1,)), _t("STOP_WORDS_DICT", "TYPE_STRING", (-1,)),
              _t("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,)), _t("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,)),
              _t("END_ID", "TYPE_INT32"), _t("PAD_ID", "TYPE_INT32"),
              _t("APPLY_CHAT_TEMPLATE", "TYPE_BOOL"))  # trtspec's: the chat template for this request
# As upstream's preprocessing sends them (tensorrtllm_backend v0.19.0 preprocessing/1/model.py): DECODER_INPUT_ID is
# [B, 1] of pad_id and REQUEST_DECODER_INPUT_LEN [B, 1] of 1 for a decoder-only model, EMBEDDING_BIAS [B, vocab]
# (or [B, 0] without embedding_bias_words). ECHO_IDS and ERRORS_IN_BAND are trtspec's.
PRE_OUTPUTS = (_t("INPUT_ID", "TYPE_INT32", (-1,)), _t("REQUEST_INPUT_LEN", "TYPE_INT32"),
               _t("DECODER_INPUT_ID", "TYPE_INT32", (-1,)), _t("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32"),
               _t("REQUEST_OUTPUT_LEN", "TYPE_INT32"), _t("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
               _t("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)), _t("EMBEDDING_BIAS", "TYPE_FP32", (-1,)),
               _t("OUT_END_ID", "TYPE_INT32"), _t("OUT_PAD_ID", "TYPE_INT32"),
               _t("ECHO_IDS", "TYPE_INT32", (-1,)), _t("ERRORS_IN_BAND", "TYPE_BOOL"))

# Every request tensor of upstream's tensorrt_llm model (tensorrtllm_backend v0.19.0 tensorrt_llm/config.pbtxt), so a
# client talking to it directly gets the engine's own answer for each (trtspec.triton.serving.CPU_POLICY), then
# trtspec's own.
ENGINE_INPUTS = (
    _t("input_ids", "TYPE_INT32", (-1,), optional=False), _t("input_lengths", "TYPE_INT32", optional=False),
    _t("request_output_len", "TYPE_INT32", optional=False), _t("end_id", "TYPE_INT32"), _t("pad_id", "TYPE_INT32"),
    _t("encoder_input_features", "TYPE_FP32", (-1, -1)), _t("encoder_output_lengths", "TYPE_INT32"),
    _t("draft_input_ids", "TYPE_INT32", (-1,)), _t("draft_logits", "TYPE_FP32", (-1, -1)),
    _t("draft_acceptance_threshold", "TYPE_FP32"),
    _t("decoder_input_ids", "TYPE_INT32", (-1,)), _t("decoder_input_lengths", "TYPE_INT32"),
    _t("stop_words_list", "TYPE_INT32", (2, -1)), _t("bad_words_list", "TYPE_INT32", (2, -1)),
    _t("embedding_bias", "TYPE_FP32", (-1,)),
    _t("runtime_top_k", "TYPE_INT32"), _t("runtime_top_p", "TYPE_FP32"), _t("runtime_top_p_min", "TYPE_FP32"),
    _t("runtime_top_p_decay", "TYPE_FP32"), _t("runtime_top_p_reset_ids", "TYPE_INT32"),
    _t("temperature", "TYPE_FP32"), _t("len_penalty", "TYPE_FP32"), _t("early_stopping", "TYPE_BOOL"),
    _t("repetition_penalty", "TYPE_FP32"), _t("min_length", "TYPE_INT32"), _t("min_tokens", "TYPE_INT32"),
    _t("beam_search_diversity_rate", "TYPE_FP32"),
    _t("presence_penalty", "TYPE_FP32"), _t("frequency_penalty", "TYPE_FP32"),
    _t("random_seed", "TYPE_UINT64"), _t("seed", "TYPE_UINT64"), _t("return_log_probs", "TYPE_BOOL"),
    _t("return_context_logits", "TYPE_BOOL"), _t("return_generation_logits", "TYPE_BOOL"),
    _t("return_perf_metrics", "TYPE_BOOL"),
    _t("beam_width", "TYPE_INT32"), _t("num_return_sequences", "TYPE_INT32"), _t("streaming", "TYPE_BOOL"),
    _t("exclude_input_in_output", "TYPE_BOOL"),
    _t("prompt_embedding_table", "TYPE_FP16", (-1, -1)), _t("prompt_table_extra_ids", "TYPE_UINT64", (-1,)),
    _t("prompt_table_extra_id", "TYPE_UINT64"), _t("prompt_vocab_size", "TYPE_INT32"),
    _t("cross_attention_mask", "TYPE_BOOL", (-1, -1)), _t("mrope_rotary_cos_sin", "TYPE_FP32", (-1,)),
    _t("mrope_position_deltas", "TYPE_INT64"),
    _t("lora_task_id", "TYPE_UINT64"), _t("lora_weights", "TYPE_FP16", (-1, -1)),
    _t("lora_config", "TYPE_INT32", (-1, 3)), _t("context_phase_params", "TYPE_UINT8", (-1,)),
    _t("skip_cross_attn_blocks", "TYPE_BOOL"),
    _t("retention_token_range_starts", "TYPE_INT32", (-1,)), _t("retention_token_range_ends", "TYPE_INT32", (-1,)),
    _t("retention_token_range_priorities", "TYPE_INT32", (-1,)),
    _t("retention_token_range_durations_ms", "TYPE_INT32", (-1,)),
    _t("retention_decode_priority", "TYPE_INT32"), _t("retention_decode_duration_ms", "TYPE_INT32"),
    _t("guided_decoding_guide_type", "TYPE_STRING"), _t("guided_decoding_guide", "TYPE_STRING"),
    *(_t(name, "TYPE_INT32") for name in LOOKAHEAD_INPUTS),
    _t("stop", "TYPE_BOOL"),
    # trtspec's
    _t("use_speculation", "TYPE_BOOL"), _t("draft_method", "TYPE_STRING"), _t("echo_ids", "TYPE_INT32", (-1,)),
    _t("errors_in_band", "TYPE_BOOL"), _t("one_response", "TYPE_BOOL"),
)
# engine inputs a client sends to the engine model directly, never through the ensemble (upstream's ensemble has no
# `stop`: its clients stop a request by sending stop = true with the request's id to tensorrt_llm; the rest are
# inputs upstream's ensemble has no tensor for)
ENGINE_ONLY_INPUTS = frozenset({
    "stop", "encoder_input_features", "encoder_output_lengths", "draft_input_ids", "draft_logits",
    "draft_acceptance_threshold", "decoder_input_lengths", "runtime_top_p_min", "runtime_top_p_decay",
    "runtime_top_p_reset_ids", "early_stopping", "beam_search_diversity_rate", "prompt_table_extra_ids",
    "cross_attention_mask", "mrope_rotary_cos_sin", "mrope_position_deltas", "context_phase_params",
    "skip_cross_attn_blocks", "retention_token_range_starts", "retention_token_range_ends",
    "retention_token_range_priorities", "retention_token_range_durations_ms", "retention_decode_priority",
    "retention_decode_duration_ms", "decoder_input_ids", "one_response"})
# Triton's ensemble before core#466 (2026) never finishes a request once a step reports an error while another
# step of it is still in flight (it stops counting finished steps): preprocessing sets `errors_in_band`, and the
# engine model then ends a stream that fails after its first response with the final flag alone (the reason goes
# to the server log) instead of an error.
ENGINE_OUTPUTS = (
    _t("output_ids", "TYPE_INT32", (-1, -1)), _t("sequence_length", "TYPE_INT32", (-1,)),
    _t("context_ids", "TYPE_INT32", (-1,)), _t("is_final", "TYPE_BOOL"),
    _t("cum_log_probs", "TYPE_FP32", (-1,)), _t("output_log_probs", "TYPE_FP32", (-1, -1)),
    _t("batch_index", "TYPE_INT32"), _t("sequence_index", "TYPE_INT32"),
    *PERF_METRIC_OUTPUTS, *NEVER_FILLED_OUTPUTS,
    _t("num_draft_tokens", "TYPE_INT32"), _t("num_accepted_tokens", "TYPE_INT32"),
    _t("num_verify_steps", "TYPE_INT32"), _t("steps_per_profile", "TYPE_STRING"), _t("finish_reason", "TYPE_STRING"),
    _t("stop_request_id", "TYPE_STRING"),  # the id a stop request names to end this request
    _t("num_input_tokens", "TYPE_INT32"),  # the prompt's tokens (trtspec's)
    _t("position_acceptance", "TYPE_STRING"),  # per draft depth: steps that drafted it, steps that accepted it
)
POST_INPUTS = (_t("TOKENS_BATCH", "TYPE_INT32", (-1, -1), optional=False),
               _t("SEQUENCE_LENGTH", "TYPE_INT32", (-1,), optional=False),
               _t("CONTEXT_IDS", "TYPE_INT32", (-1,)), _t("IS_FINAL", "TYPE_BOOL"),
               _t("STOP_REQUEST_ID", "TYPE_STRING"))
POST_OUTPUTS = (_t("OUTPUT", "TYPE_STRING", (-1,)),)

# client tensors that go to preprocessing beyond upstream's shared wiring (contract.CLIENT_TO_PRE), and what
# preprocessing hands the engine beyond contract.PRE_TO_LLM
CPU_CLIENT_TO_PRE = {"decoder_text_input": "DECODER_QUERY", "embedding_bias_words": "EMBEDDING_BIAS_WORDS",
                     "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS", "apply_chat_template": "APPLY_CHAT_TEMPLATE"}
CPU_PRE_TO_LLM = {"EMBEDDING_BIAS": ("_EMBEDDING_BIAS", "embedding_bias"), "ECHO_IDS": ("_ECHO_IDS", "echo_ids"),
                  "ERRORS_IN_BAND": ("_ERRORS_IN_BAND", "errors_in_band")}


def ensemble_steps() -> tuple[Step, ...]:
    """Upstream's wiring (contract.CLIENT_TO_PRE / PRE_TO_LLM / CLIENT_TO_LLM) plus trtspec's streaming tensors."""
    pre_to_llm = {**PRE_TO_LLM, **CPU_PRE_TO_LLM}
    to_pre = {**CLIENT_TO_PRE, **CPU_CLIENT_TO_PRE}
    pre = Step("preprocessing", {target: source for source, target in to_pre.items()},
               {out: internal for out, (internal, _) in pre_to_llm.items()})
    from_pre = {llm: internal for internal, llm in pre_to_llm.values()}
    client_names = {llm: client for client, llm in CLIENT_TO_LLM.items()}
    client = {t.name for t in cpu_ensemble_inputs()}
    from_client = {t.name: client_names.get(t.name, t.name) for t in ENGINE_INPUTS
                   if t.name not in from_pre and t.name not in ENGINE_ONLY_INPUTS
                   and client_names.get(t.name, t.name) in client}
    internal = {"sequence_length": "_SEQUENCE_LENGTH", "context_ids": "_CONTEXT_IDS", "is_final": "_IS_FINAL",
                "stop_request_id": "_STOP_REQUEST_ID"}
    engine = Step(ENGINE_MODEL, {**from_pre, **from_client},
                  {t.name: internal.get(t.name, t.name) for t in ENGINE_OUTPUTS})
    post = Step("postprocessing", {"TOKENS_BATCH": "output_ids", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH",
                                   "CONTEXT_IDS": "_CONTEXT_IDS", "IS_FINAL": "_IS_FINAL",
                                   "STOP_REQUEST_ID": "_STOP_REQUEST_ID"},
                {"OUTPUT": "text_output"})
    return pre, engine, post


def preprocessing_config(batch: int, options: DeployOptions, end_id: int | None, pad_id: int | None,
                         vocab_size: int) -> str:
    # chat_template: the default for requests that send no apply_chat_template (upstream: never; `deploy
    # --chat-template` turns it on); vocab_size: the width of EMBEDDING_BIAS (the engine's logits)
    params = {"tokenizer_dir": "1/tokenizer", "chat_template": str(options.chat_template).lower(),
              "add_special_tokens": "true", "vocab_size": str(vocab_size)}
    if end_id is not None:
        params["end_id"] = str(end_id)
    if pad_id is not None:
        params["pad_id"] = str(pad_id)
    return render(TritonModelConfig(name="preprocessing", backend="python", max_batch_size=batch, dynamic_batching={},
                              inputs=PRE_INPUTS, outputs=PRE_OUTPUTS, instance_count=1, parameters=params))


def engine_model_name(options: DeployOptions) -> str:
    return ENGINE_MODEL if options.decoupled else UNARY_ENGINE_MODEL


def engine_config(batch: int, options: DeployOptions, engine_path: str, datastore_path: str = "") -> str:
    """The engine model: always decoupled (its scheduler answers from its own thread, batching every request in
    flight); named tensorrt_llm, or trtspec_engine behind the unary forwarder."""
    params = {"engine_dir": engine_path, "threads": str(options.threads or 0), "exclude_input_in_output": "false",
              "spin": {None: "auto", True: "true", False: "false"}[options.spin],
              "method": options.method or "auto", "datastore": datastore_path,
              "backoff": "true" if options.backoff else "false", "draft_budget": str(options.draft_budget or 0)}
    return render(TritonModelConfig(name=engine_model_name(options), backend="python", max_batch_size=batch,
                              decoupled=True, dynamic_batching={}, inputs=ENGINE_INPUTS, outputs=ENGINE_OUTPUTS,
                              instance_count=options.instances, parameters=params))


def unary_forwarder_config(batch: int) -> str:
    """`tensorrt_llm` of a --no-decoupled repository: one instance per batch row (each waits for its request while
    the engine batches them all), no dynamic batcher (one request per execute)."""
    return render(TritonModelConfig(name=ENGINE_MODEL, backend="python", max_batch_size=batch, inputs=ENGINE_INPUTS,
                              outputs=ENGINE_OUTPUTS, instance_count=batch,
                              parameters={"engine_model": UNARY_ENGINE_MODEL}))


def postprocessing_config(batch: int) -> str:
    # No dynamic batcher: Triton's ensemble (2.5x and later) never cancels a step already running, so a cancelled
    # stream's engine request would run on; it only marks the steps it schedules next as cancelled, and a dynamic
    # batcher drops those (core src/scheduler_utils.cc), which in Triton before core#466 (2026) leaves the ensemble
    # in flight for ever. Without one, the cancelled postprocessing request reaches the model, which answers it and
    # forwards a stop request for its engine request (python_models/postprocessing.py).
    return render(TritonModelConfig(name="postprocessing", backend="python", max_batch_size=batch,
                              inputs=POST_INPUTS, outputs=POST_OUTPUTS, instance_count=1,
                              parameters={"tokenizer_dir": "1/tokenizer", "skip_special_tokens": "true"}))


def ensemble_config(batch: int) -> str:
    return render(TritonModelConfig(name="ensemble", platform="ensemble", max_batch_size=batch,
                              inputs=cpu_ensemble_inputs(), outputs=cpu_ensemble_outputs(), steps=ensemble_steps()))


BLS_MODEL = "tensorrt_llm_bls"


def bls_config(batch: int, options: DeployOptions) -> str:
    """tensorrtllm_backend's BLS interface (tensorrt_llm_bls/config.pbtxt: the ensemble's tensors plus num_draft_tokens
    and use_draft_logits), relaying to the ensemble: decoupled with it, else one instance per batch row."""
    inputs = cpu_ensemble_inputs() + (_t("num_draft_tokens", "TYPE_INT32"), _t("use_draft_logits", "TYPE_BOOL"))
    return render(TritonModelConfig(name=BLS_MODEL, backend="python", max_batch_size=batch, decoupled=options.decoupled,
                              inputs=inputs, outputs=cpu_ensemble_outputs(),
                              instance_count=1 if options.decoupled else batch,
                              parameters={"ensemble_model": "ensemble"}))


def _model_source(name: str) -> str:
    return (MODEL_SOURCES / f"{name}.py").read_text()


DATASTORE_FILE = "datastore.ds"


def _path_from_repo(path: Path, options: DeployOptions) -> str:
    """`path` relative to the repository root, so the pair can move together; absolute when they share no root."""
    relative = os.path.relpath(path, Path(options.out).resolve())
    return str(path) if relative.startswith(".." + os.sep + ".." + os.sep + ".." + os.sep) else relative


def write_cpu_repository(manifest: Manifest, options: DeployOptions, staging: Path, batch: int) -> None:
    """Write the four models into the empty staging directory (options checked, batch: Triton's max_batch_size)."""
    engine_dir = Path(options.engine_dir).resolve()
    if manifest.tokenizer is None:
        raise RepositoryError(f"{engine_dir / 'manifest.json'}: the engine has no tokenizer (field 'tokenizer' is "
                              "null); rebuild it with --tokenizer DIR so preprocessing can turn text into tokens")
    tokenizer = engine_dir / manifest.tokenizer
    for name in ("preprocessing", "postprocessing"):
        version = staging / name / "1"
        version.mkdir(parents=True)
        (version / "model.py").write_text(_model_source(name))
        shutil.copytree(tokenizer, version / "tokenizer")
    (staging / "preprocessing" / "config.pbtxt").write_text(
        preprocessing_config(batch, options, manifest.model.end_id, manifest.model.pad_id,
                             manifest.model.vocab_size))
    (staging / "postprocessing" / "config.pbtxt").write_text(postprocessing_config(batch))

    engine_model = engine_model_name(options)
    version = staging / engine_model / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(_model_source(ENGINE_MODEL))
    if not options.decoupled:
        (staging / ENGINE_MODEL / "1").mkdir(parents=True)
        (staging / ENGINE_MODEL / "1" / "model.py").write_text(_model_source("unary_forwarder"))
        (staging / ENGINE_MODEL / "config.pbtxt").write_text(unary_forwarder_config(batch))
    if options.copy_engine:
        shutil.copytree(engine_dir, version / "engine")
        engine_path = f"{engine_model}/1/engine"
    else:
        engine_path = _path_from_repo(engine_dir, options)
    datastore_path = ""
    if options.datastore is not None:  # the suffix drafter's corpus: copied with the engine, else referenced
        if options.copy_engine:
            shutil.copyfile(options.datastore, version / DATASTORE_FILE)
            datastore_path = f"{engine_model}/1/{DATASTORE_FILE}"
        else:
            datastore_path = _path_from_repo(Path(options.datastore).resolve(), options)
    (staging / engine_model / "config.pbtxt").write_text(engine_config(batch, options, engine_path, datastore_path))

    (staging / BLS_MODEL / "1").mkdir(parents=True)
    (staging / BLS_MODEL / "1" / "model.py").write_text(_model_source(BLS_MODEL))
    (staging / BLS_MODEL / "config.pbtxt").write_text(bls_config(batch, options))

    (staging / "ensemble" / "1").mkdir(parents=True)
    (staging / "ensemble" / "config.pbtxt").write_text(ensemble_config(batch))
