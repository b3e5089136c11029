"""Tensor lists of the GPU repository's models, per TensorRT-LLM version (`docs/upstream-sources.md`).

The client-facing tensors come from `trtspec.triton.contract`, so the CPU and GPU flavours share one contract;
the `tensorrt_llm` model's tensors are the C++ backend's names for the engine's version.
"""

from __future__ import annotations

from trtspec.engine.trtllm_versions import TrtllmVersion
from trtspec.triton.contract import CLIENT_TO_LLM, CLIENT_TO_PRE, ENSEMBLE_OUTPUTS, PRE_TO_LLM, client_inputs  # noqa: F401
from trtspec.triton.contract import PERF_METRIC_OUTPUTS
from trtspec.triton.pbtxt import Tensor

SCALAR = ()  # reshape: { shape: [ ] } — the backend sees [B] for a [1] input (tensorrtllm_backend all_models/inflight_batcher_llm/)
LOGITS_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}


def has_perf_metrics(version: TrtllmVersion) -> bool:
    """`return_perf_metrics` and its ten outputs, as in the v0.19 templates (tensorrtllm_backend tensorrt_llm/config.pbtxt)."""
    return version.at_least(0, 19)


def perf_metric_outputs() -> tuple[Tensor, ...]:
    """tensorrt_llm's perf metrics (filled with return_perf_metrics = true), which upstream's v0.19 ensemble passes on under
    the same names and dims [1] (tensorrtllm_backend ensemble/config.pbtxt), and end_to_end_grpc_client.py
    --return-perf-metrics asks for all ten."""
    return tuple(Tensor(t.name, t.data_type, t.dims) for t in PERF_METRIC_OUTPUTS)


def ensemble_inputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    """The contract's request tensors with this version's spelling, plus `return_perf_metrics` where it exists."""
    out = tuple(Tensor(t.name, t.data_type, t.dims, optional=t.optional)
                for t in client_inputs(newest_names=version.newest_input_names))
    if has_perf_metrics(version):
        out += (Tensor("return_perf_metrics", "TYPE_BOOL", optional=True),)
    return out


def ensemble_outputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    out = tuple(Tensor(t.name, t.data_type, t.dims) for t in ENSEMBLE_OUTPUTS)
    out += (Tensor("output_ids", "TYPE_INT32", (-1,)),)
    if has_perf_metrics(version):
        out += perf_metric_outputs()
    return out


def preprocessing_inputs() -> tuple[Tensor, ...]:
    return (Tensor("QUERY", "TYPE_STRING"), Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32"),
            Tensor("BAD_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
            Tensor("STOP_WORDS_DICT", "TYPE_STRING", (-1,), optional=True),
            Tensor("END_ID", "TYPE_INT32", optional=True), Tensor("PAD_ID", "TYPE_INT32", optional=True))


def preprocessing_outputs() -> tuple[Tensor, ...]:
    return (Tensor("INPUT_ID", "TYPE_INT32", (-1,)), Tensor("REQUEST_INPUT_LEN", "TYPE_INT32"),
            Tensor("BAD_WORDS_IDS", "TYPE_INT32", (2, -1)), Tensor("STOP_WORDS_IDS", "TYPE_INT32", (2, -1)),
            Tensor("REQUEST_OUTPUT_LEN", "TYPE_INT32", (-1,)), Tensor("OUT_END_ID", "TYPE_INT32"),
            Tensor("OUT_PAD_ID", "TYPE_INT32"))


def postprocessing_inputs() -> tuple[Tensor, ...]:
    return Tensor("TOKENS_BATCH", "TYPE_INT32", (-1, -1)), Tensor("SEQUENCE_LENGTH", "TYPE_INT32", (-1,))


def postprocessing_outputs() -> tuple[Tensor, ...]:
    return Tensor("OUTPUT", "TYPE_STRING", (-1,)), Tensor("OUTPUT_IDS", "TYPE_INT32", (-1,))


def llm_inputs(version: TrtllmVersion, logits_type: str) -> tuple[Tensor, ...]:
    """The C++ backend's request tensors this repository uses (tensorrtllm_backend tensorrt_llm/config.pbtxt); multimodal, LoRA, prompt tuning,
    encoder-decoder and KV-retention inputs are left out."""
    ragged = dict(optional=True, allow_ragged_batch=True)
    scalar = dict(optional=True, reshape=SCALAR)
    min_len, seed = ("min_tokens", "seed") if version.newest_input_names else ("min_length", "random_seed")
    out = [Tensor("input_ids", "TYPE_INT32", (-1,), **ragged),
           Tensor("input_lengths", "TYPE_INT32", reshape=SCALAR),
           Tensor("request_output_len", "TYPE_INT32", reshape=SCALAR),
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
           Tensor("streaming", "TYPE_BOOL", **scalar), Tensor("num_return_sequences", "TYPE_INT32", **scalar)]
    if has_perf_metrics(version):
        out.append(Tensor("return_perf_metrics", "TYPE_BOOL", **scalar))
    if version.has_lookahead_parameters:  # per-request (w, n, g) within the engine's (W, N, G) (tensorrtllm_backend tensorrt_llm/config.pbtxt)
        out += [Tensor(f"lookahead_{k}", "TYPE_INT32", **ragged)
                for k in ("window_size", "ngram_size", "verification_set_size")]
    return tuple(out)


def llm_outputs(version: TrtllmVersion, logits_type: str) -> tuple[Tensor, ...]:
    out = [Tensor("output_ids", "TYPE_INT32", (-1, -1)), Tensor("sequence_length", "TYPE_INT32", (-1,)),
           Tensor("cum_log_probs", "TYPE_FP32", (-1,)), Tensor("output_log_probs", "TYPE_FP32", (-1, -1)),
           Tensor("context_logits", logits_type, (-1, -1)), Tensor("generation_logits", logits_type, (-1, -1, -1)),
           Tensor("batch_index", "TYPE_INT32"), Tensor("sequence_index", "TYPE_INT32")]
    if has_perf_metrics(version):
        out += perf_metric_outputs()
    return tuple(out)


def bls_inputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    """The ensemble's request tensors plus draft-target's `num_draft_tokens` / `use_draft_logits` (tensorrtllm_backend tensorrt_llm_bls/config.pbtxt)."""
    return ensemble_inputs(version) + (Tensor("num_draft_tokens", "TYPE_INT32", optional=True),
                                       Tensor("use_draft_logits", "TYPE_BOOL", optional=True))


def bls_outputs(version: TrtllmVersion) -> tuple[Tensor, ...]:
    # `num_draft_tokens` is a BLS input (upstream's API), so the drafted count goes out under upstream's
    # perf-metric name; trtspec's BLS also counts its verify steps. From 0.19 the other perf metrics too, passed on
    # from tensorrt_llm as upstream's BLS declares them (tensorrtllm_backend tensorrt_llm_bls/config.pbtxt).
    out = (tuple(Tensor(t.name, t.data_type, t.dims) for t in ENSEMBLE_OUTPUTS)
           + (Tensor("output_ids", "TYPE_INT32", (-1,)), Tensor("num_accepted_tokens", "TYPE_INT32"),
              Tensor("num_verify_steps", "TYPE_INT32"), Tensor("total_draft_tokens", "TYPE_INT32"),
              Tensor("total_accepted_draft_tokens", "TYPE_INT32")))
    if has_perf_metrics(version):
        out += tuple(t for t in perf_metric_outputs() if t.name not in {x.name for x in out})
    return out


def client_to_llm_name(name: str) -> str | None:
    """The tensorrt_llm tensor a client tensor feeds directly, or None (it goes to preprocessing)."""
    if name in CLIENT_TO_PRE:
        return None
    return CLIENT_TO_LLM.get(name, name)

