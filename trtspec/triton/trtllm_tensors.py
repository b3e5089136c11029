"""Tensor lists of the GPU repository's models, per TensorRT-LLM version (`docs/upstream-sources.md`).

The client-facing tensors come from `trtspec.triton.contract`, so the CPU and GPU flavours share one contract;
the `tensorrt_llm` model's tensors are the C++ backend's names for the engine's version.
"""

from __future__ import annotations

from trtspec.engine.trtllm_versions import TrtllmVersion
from trtspec.triton.contract import CLIENT_TO_LLM, CLIENT_TO_PRE, ENSEMBLE_OUTPUTS, PRE_TO_LLM, client_inputs  # noqa: F401
from trtspec.triton.contract import PERF_METRIC_OUTPUTS, UPSTREAM_EXTRA_INPUTS
from trtspec.triton.pbtxt import Tensor

SCALAR = ()  # reshape: { shape: [ ] } — the backend sees [B] for a [1] input (tensorrtllm_backend all_models/inflight_batcher_llm/)
LOGITS_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}


def has_perf_metrics(version: TrtllmVersion) -> bool:
    """`return_perf_metrics` and its ten outputs, as in the v0.19 templates (tensorrtllm_backend tensorrt_llm/config.pbtxt)."""
    return version.at_least(0, 19)


def has_kv_cache_reuse_stats(version: TrtllmVersion) -> bool:
    """`return_kv_cache_reuse_stats` and its three `kv_cache_*` outputs: the v0.16-v0.18 templates (ensemble, BLS and
    tensorrt_llm config.pbtxt); v0.19 folds them into `return_perf_metrics`, v0.15 has neither."""
    return version.at_least(0, 16) and not has_perf_metrics(version)


def has_guided_decoding(version: TrtllmVersion) -> bool:
    """`guided_decoding_guide_type` / `guided_decoding_guide` on the ensemble, BLS and tensorrt_llm: from the v0.19
    templates (tensorrtllm_backend ensemble/config.pbtxt; v0.18's tensorrt_llm has no such input)."""
    return version.at_least(0, 19)


def perf_metric_outputs(version: TrtllmVersion | None = None) -> tuple[Tensor, ...]:
    """tensorrt_llm's perf metrics (filled with return_perf_metrics = true), which upstream's v0.19 ensemble passes on under
    the same names and dims [1] (tensorrtllm_backend ensemble/config.pbtxt), and end_to_end_grpc_client.py
    --return-perf-metrics asks for all ten. For a v0.16-v0.18 engine the three kv_cache_* of
    `return_kv_cache_reuse_stats`, for v0.15 none."""
    if version is None or has_perf_metrics(version):
        return tuple(Tensor(t.name, t.data_type, t.dims) for t in PERF_METRIC_OUTPUTS)
    if has_kv_cache_reuse_stats(version):
        return tuple(Tensor(t.name, t.data_type, t.dims) for t in PERF_METRIC_OUTPUTS
                     if t.name.startswith("kv_cache_"))
    return ()


def metrics_switch(version: TrtllmVersion) -> str | None:
    """The request switch that fills perf_metric_outputs(version), under this version's name."""
    if has_perf_metrics(version):
        return "return_perf_metrics"
    return "return_kv_cache_reuse_stats" if has_kv_cache_reuse_stats(version) else None


# Upstream's other ensemble inputs (tensorrtllm_backend ensemble/config.pbtxt, v0.15-v0.19, and TensorRT-LLM
# triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt): names, types and dims as the contract
# declares them for the CPU flavour, flags as upstream's ensemble has them. The GPU ensemble wires them as upstream's
# does: to preprocessing (GPU_CLIENT_TO_PRE) or straight to tensorrt_llm, whose C++ backend honours them itself.
_RAGGED_EXTRAS = {"lora_weights", "lora_config", "guided_decoding_guide_type", "guided_decoding_guide"}
GUIDED_DECODING_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")


def upstream_extra_inputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    """The inputs upstream's ensemble of this version declares beyond the contract's first table (the metrics switch
    is `metrics_switch`)."""
    skip = {"return_perf_metrics"} | (set() if has_guided_decoding(version) else set(GUIDED_DECODING_INPUTS))
    return tuple(Tensor(t.name, t.data_type, t.dims, optional=True, allow_ragged_batch=t.name in _RAGGED_EXTRAS)
                 for t in UPSTREAM_EXTRA_INPUTS if t.name not in skip)


# client tensor → preprocessing input beyond the contract's CLIENT_TO_PRE, and preprocessing output → (ensemble
# tensor, tensorrt_llm input) beyond PRE_TO_LLM: upstream's ensemble wiring (tensorrtllm_backend ensemble/config.pbtxt).
GPU_CLIENT_TO_PRE = {**CLIENT_TO_PRE, "decoder_text_input": "DECODER_QUERY",
                     "embedding_bias_words": "EMBEDDING_BIAS_WORDS", "embedding_bias_weights": "EMBEDDING_BIAS_WEIGHTS",
                     "prompt_table_extra_id": "PROMPT_TABLE_EXTRA_ID"}
GPU_PRE_TO_LLM = {**PRE_TO_LLM, "DECODER_INPUT_ID": ("_DECODER_INPUT_ID", "decoder_input_ids"),
                  "REQUEST_DECODER_INPUT_LEN": ("_REQUEST_DECODER_INPUT_LEN", "decoder_input_lengths"),
                  "EMBEDDING_BIAS": ("_EMBEDDING_BIAS", "embedding_bias"),
                  "OUT_PROMPT_TABLE_EXTRA_IDS": ("_OUT_PROMPT_TABLE_EXTRA_IDS", "prompt_table_extra_ids")}


def ensemble_inputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    """The contract's request tensors with this version's spelling, this version's metrics switch, and the other
    inputs upstream's ensemble of this version declares."""
    out = tuple(Tensor(t.name, t.data_type, t.dims, optional=t.optional)
                for t in client_inputs(newest_names=version.newest_input_names))
    if metrics_switch(version):
        out += (Tensor(metrics_switch(version), "TYPE_BOOL", optional=True),)
    return out + upstream_extra_inputs(version)


def ensemble_outputs(version: TrtllmVersion, logits_type: str = "TYPE_FP32") -> tuple[Tensor, ...]:
    # output_ids: tensorrt_llm's own, [1, beams, L] per response (-1 after a shorter beam), as the CPU flavour sends
    # it (tensorrtllm_backend inflight_batcher_llm/src/model_instance_state.cc builds it {1, beams, maxBeamLength})
    out = tuple(Tensor(t.name, t.data_type, t.dims) for t in ENSEMBLE_OUTPUTS)
    out += (Tensor("output_ids", "TYPE_INT32", (-1, -1)),) + logits_outputs(logits_type)
    return out + perf_metric_outputs(version)


def logits_outputs(logits_type: str) -> tuple[Tensor, ...]:
    """Filled with return_context_logits / return_generation_logits; upstream's ensemble and BLS pass them on in the
    engine's logits type (tensorrtllm_backend ensemble/config.pbtxt `${logits_datatype}`)."""
    return Tensor("context_logits", logits_type, (-1, -1)), Tensor("generation_logits", logits_type, (-1, -1, -1))


def preprocessing_inputs() -> tuple[Tensor, ...]:
    # tensorrtllm_backend preprocessing/config.pbtxt (multimodal inputs left out)
    return (Tensor("QUERY", "TYPE_STRING"), Tensor("DECODER_QUERY", "TYPE_STRING", optional=True),
            Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32"),
            Tensor("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
            Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
            Tensor("EMBEDDING_BIAS_WORDS", "TYPE_STRING", (-1,), optional=True),
            Tensor("EMBEDDING_BIAS_WEIGHTS", "TYPE_FP32", (-1,), optional=True),
            Tensor("END_ID", "TYPE_INT32", optional=True), Tensor("PAD_ID", "TYPE_INT32", optional=True),
            Tensor("PROMPT_TABLE_EXTRA_ID", "TYPE_UINT64", optional=True))


def preprocessing_outputs() -> tuple[Tensor, ...]:
    # tensorrtllm_backend preprocessing/config.pbtxt (multimodal outputs left out)
    return (Tensor("INPUT_ID", "TYPE_INT32", (-1,)), Tensor("REQUEST_INPUT_LEN", "TYPE_INT32"),
            Tensor("DECODER_INPUT_ID", "TYPE_INT32", (-1,)), Tensor("REQUEST_DECODER_INPUT_LEN", "TYPE_INT32"),
            Tensor("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)), Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
            Tensor("EMBEDDING_BIAS", "TYPE_FP32", (-1,)),
            Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)), Tensor("OUT_END_ID", "TYPE_INT32"),
            Tensor("OUT_PAD_ID", "TYPE_INT32"), Tensor("OUT_PROMPT_TABLE_EXTRA_IDS", "TYPE_UINT64", (-1,)))


def postprocessing_inputs() -> tuple[Tensor, ...]:
    return Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)), Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,))


def postprocessing_outputs() -> tuple[Tensor, ...]:
    return (Tensor("OUTPUT", "TYPE_STRING", (-1,)),)  # as upstream's postprocessing/config.pbtxt


def llm_inputs(version: TrtllmVersion, logits_type: str) -> tuple[Tensor, ...]:
    """The C++ backend's request tensors this repository uses (tensorrtllm_backend tensorrt_llm/config.pbtxt), those
    upstream's ensemble or end_to_end_test.py send included; multimodal, encoder, context-phase and KV-retention inputs
    are left out."""
    ragged = dict(optional=True, allow_ragged_batch=True)
    scalar = dict(optional=True, reshape=SCALAR)
    min_len, seed = ("min_tokens", "seed") if version.newest_input_names else ("min_length", "random_seed")
    out = [Tensor("input_ids", "TYPE_INT32", (-1,), **ragged),
           Tensor("input_lengths", "TYPE_INT32", reshape=SCALAR),
           Tensor("request_output_len", "TYPE_INT32", reshape=SCALAR),
           # a decoder-only model's executor ignores them (tensorrtllm_backend inflight_batcher_llm/src/utils.cc reads
           # decoder_input_ids for encoder-decoder models only); upstream's ensemble always sends them
           Tensor("decoder_input_ids", "TYPE_INT32", (-1,), **ragged),
           Tensor("decoder_input_lengths", "TYPE_INT32", **scalar),
           Tensor("draft_input_ids", "TYPE_INT32", (-1,), **ragged),
           Tensor("draft_logits", logits_type, (-1, -1), **ragged),
           Tensor("draft_acceptance_threshold", "TYPE_FP32", **scalar),
           Tensor("end_id", "TYPE_INT32", **scalar), Tensor("pad_id", "TYPE_INT32", **scalar),
           Tensor("stop_words_list", "TYPE_INT32", (2, -1), **ragged),
           Tensor("bad_words_list", "TYPE_INT32", (2, -1), **ragged),
           Tensor("embedding_bias", "TYPE_FP32", (-1,), **ragged),
           Tensor("beam_width", "TYPE_INT32", **scalar), Tensor("temperature", "TYPE_FP32", **scalar),
           Tensor("runtime_top_k", "TYPE_INT32", **scalar), Tensor("runtime_top_p", "TYPE_FP32", **scalar),
           Tensor("len_penalty", "TYPE_FP32", **scalar), Tensor("early_stopping", "TYPE_BOOL", **scalar),
           Tensor("repetition_penalty", "TYPE_FP32", **scalar), Tensor(min_len, "TYPE_INT32", **scalar),
           Tensor("presence_penalty", "TYPE_FP32", **scalar), Tensor("frequency_penalty", "TYPE_FP32", **scalar),
           Tensor(seed, "TYPE_UINT64", **scalar), Tensor("return_log_probs", "TYPE_BOOL", **scalar),
           Tensor("return_context_logits", "TYPE_BOOL", **scalar),
           Tensor("return_generation_logits", "TYPE_BOOL", **scalar),
           Tensor("exclude_input_in_output", "TYPE_BOOL", **scalar), Tensor("stop", "TYPE_BOOL", **scalar),
           Tensor("streaming", "TYPE_BOOL", **scalar), Tensor("num_return_sequences", "TYPE_INT32", **scalar),
           Tensor("prompt_embedding_table", "TYPE_FP16", (-1, -1), **ragged),
           Tensor("prompt_table_extra_ids", "TYPE_UINT64", (-1,), **ragged),
           Tensor("prompt_vocab_size", "TYPE_INT32", **scalar),
           Tensor("lora_task_id", "TYPE_UINT64", **scalar),
           Tensor("lora_weights", "TYPE_FP16", (-1, -1), **ragged),
           Tensor("lora_config", "TYPE_INT32", (-1, 3), **ragged)]
    if metrics_switch(version):
        out.append(Tensor(metrics_switch(version), "TYPE_BOOL", **scalar))
    if has_guided_decoding(version):
        out += [Tensor(name, "TYPE_STRING", **ragged) for name in GUIDED_DECODING_INPUTS]
    if version.has_lookahead_parameters:  # per-request (w, n, g) within the engine's (W, N, G) (tensorrtllm_backend tensorrt_llm/config.pbtxt)
        out += [Tensor(f"lookahead_{k}", "TYPE_INT32", **ragged)
                for k in ("window_size", "ngram_size", "verification_set_size")]
    return tuple(out)


def llm_outputs(version: TrtllmVersion, logits_type: str) -> tuple[Tensor, ...]:
    out = [Tensor("output_ids", "TYPE_INT32", (-1, -1)), Tensor("sequence_length", "TYPE_INT32", (-1,)),
           Tensor("cum_log_probs", "TYPE_FP32", (-1,)), Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
           *logits_outputs(logits_type), Tensor("batch_index", "TYPE_INT32"), Tensor("sequence_index", "TYPE_INT32")]
    out += perf_metric_outputs(version)
    return tuple(out)


def bls_inputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    """The ensemble's request tensors plus draft-target's `num_draft_tokens` / `use_draft_logits` (tensorrtllm_backend tensorrt_llm_bls/config.pbtxt)."""
    return ensemble_inputs(version) + (Tensor("num_draft_tokens", "TYPE_INT32", optional=True),
                                       Tensor("use_draft_logits", "TYPE_BOOL", optional=True))


def bls_outputs(version: TrtllmVersion, logits_type: str = "TYPE_FP32") -> tuple[Tensor, ...]:
    # `num_draft_tokens` is a BLS input (upstream's API), so the drafted count goes out under upstream's
    # perf-metric name; trtspec's BLS also counts its verify steps. From 0.19 the other perf metrics too (0.16-0.18:
    # the kv_cache_* ones), passed on from tensorrt_llm as upstream's BLS declares them (tensorrtllm_backend
    # tensorrt_llm_bls/config.pbtxt); context / generation logits as upstream's BLS passes them on.
    out = (tuple(Tensor(t.name, t.data_type, t.dims) for t in ENSEMBLE_OUTPUTS)
           + (Tensor("output_ids", "TYPE_INT32", (-1, -1)), Tensor("num_accepted_tokens", "TYPE_INT32"),
              Tensor("num_verify_steps", "TYPE_INT32"), Tensor("total_draft_tokens", "TYPE_INT32"),
              Tensor("total_accepted_draft_tokens", "TYPE_INT32")) + logits_outputs(logits_type))
    out += tuple(t for t in perf_metric_outputs(version) if t.name not in {x.name for x in out})
    return out


def client_to_llm_name(name: str) -> str | None:
    """The tensorrt_llm tensor a client tensor feeds directly, or None (it goes to preprocessing)."""
    if name in GPU_CLIENT_TO_PRE:
        return None
    return CLIENT_TO_LLM.get(name, name)

