"""The client contract: the request and response tensors of the `ensemble` model, shared by both flavours.

Names, Triton types and dims follow tensorrtllm_backend's `inflight_batcher_llm` ensemble, so a client written
for a GPU TensorRT-LLM deployment works unchanged against the CPU deployment and back. Every model has
`max_batch_size > 0`, so each tensor carries an implicit leading batch dimension (a `dims: [1]` scalar is sent
as `[B, 1]`). trtspec adds the acceptance outputs and a per-request switch for speculation, all optional.

Upstream renamed two inputs in its newest copy (`min_length` → `min_tokens`, `random_seed` → `seed`); the
CPU flavour accepts both spellings, the GPU flavour writes the one its TensorRT-LLM version reads.
"""

from __future__ import annotations

from trtspec.triton.pbtxt import Tensor


def tensor(name: str, data_type: str, dims=(1,), optional: bool = True) -> Tensor:
    """A contract tensor: optional unless said otherwise (only text_input and max_tokens are required)."""
    return Tensor(name, data_type, tuple(dims), optional=optional)


_t = tensor


# Request tensors of upstream's ensemble (tensorrtllm_backend v0.19.0 all_models/inflight_batcher_llm/ensemble/
# config.pbtxt) that both flavours declare. The GPU flavour passes them to TensorRT-LLM; what the CPU engine does with
# each is in `CPU_POLICY` below and docs/triton-contract.md.
ENSEMBLE_INPUTS: tuple[Tensor, ...] = (
    _t("text_input", "TYPE_STRING", optional=False),
    _t("max_tokens", "TYPE_INT32", optional=False),
    _t("bad_words", "TYPE_STRING", (-1,)),
    _t("stop_words", "TYPE_STRING", (-1,)),
    _t("exclude_input_in_output", "TYPE_BOOL"),
    _t("end_id", "TYPE_INT32"),
    _t("pad_id", "TYPE_INT32"),
    _t("top_k", "TYPE_INT32"),
    _t("top_p", "TYPE_FP32"),
    _t("temperature", "TYPE_FP32"),
    _t("length_penalty", "TYPE_FP32"),
    _t("repetition_penalty", "TYPE_FP32"),
    _t("min_length", "TYPE_INT32"),
    _t("presence_penalty", "TYPE_FP32"),
    _t("frequency_penalty", "TYPE_FP32"),
    _t("random_seed", "TYPE_UINT64"),
    _t("return_log_probs", "TYPE_BOOL"),
    _t("return_context_logits", "TYPE_BOOL"),
    _t("return_generation_logits", "TYPE_BOOL"),
    _t("beam_width", "TYPE_INT32"),
    _t("num_return_sequences", "TYPE_INT32"),
    _t("stream", "TYPE_BOOL"),
)

# The rest of upstream's ensemble inputs: the CPU flavour declares them too, so a client that sends one gets the
# engine's own answer (honoured, or refused in one line naming it) instead of Triton's generic "unexpected
# inference input" (upstream's own ensemble wires lora_* to tensorrt_llm from v0.15 and guided_decoding_* from v0.19,
# where the C++ backend honours them; the CPU engine refuses both).
UPSTREAM_EXTRA_INPUTS: tuple[Tensor, ...] = (
    _t("decoder_text_input", "TYPE_STRING"),
    _t("return_perf_metrics", "TYPE_BOOL"),
    _t("prompt_embedding_table", "TYPE_FP16", (-1, -1)),
    _t("prompt_table_extra_id", "TYPE_UINT64"),
    _t("prompt_vocab_size", "TYPE_INT32"),
    _t("embedding_bias_words", "TYPE_STRING", (-1,)),
    _t("embedding_bias_weights", "TYPE_FP32", (-1,)),
    _t("lora_task_id", "TYPE_UINT64"),
    _t("lora_weights", "TYPE_FP16", (-1, -1)),
    _t("lora_config", "TYPE_INT32", (-1, 3)),
    _t("guided_decoding_guide_type", "TYPE_STRING"),
    _t("guided_decoding_guide", "TYPE_STRING"),
)

# Newest upstream spelling → the v0.19 spelling it replaces.
RENAMED_INPUTS = {"min_tokens": "min_length", "seed": "random_seed"}

ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    _t("text_output", "TYPE_STRING", (-1,)),
    _t("cum_log_probs", "TYPE_FP32", (-1,)),
    _t("output_log_probs", "TYPE_FP32", (-1, -1)),
    _t("batch_index", "TYPE_INT32"),
    _t("sequence_index", "TYPE_INT32"),
)

# tensorrt_llm's per-request perf metrics, sent only with return_perf_metrics = true, each [1, 1] (tensorrtllm_backend
# inflight_batcher_llm/src/model_instance_state.cc, `processStats`: SizeType32 → INT32, float → FP32, a
# steady_clock time point → INT64 nanoseconds). What each means on the CPU engine: docs/triton-contract.md.
PERF_METRIC_OUTPUTS: tuple[Tensor, ...] = (
    _t("kv_cache_alloc_new_blocks", "TYPE_INT32"),
    _t("kv_cache_reused_blocks", "TYPE_INT32"),
    _t("kv_cache_alloc_total_blocks", "TYPE_INT32"),
    _t("arrival_time_ns", "TYPE_INT64"),
    _t("first_scheduled_time_ns", "TYPE_INT64"),
    _t("first_token_time_ns", "TYPE_INT64"),
    _t("last_token_time_ns", "TYPE_INT64"),
    _t("acceptance_rate", "TYPE_FP32"),
    _t("total_accepted_draft_tokens", "TYPE_INT32"),
    _t("total_draft_tokens", "TYPE_INT32"),
)
# Outputs upstream declares that the CPU engine never fills (their return_* switches are refused).
NEVER_FILLED_OUTPUTS: tuple[Tensor, ...] = (
    _t("context_logits", "TYPE_FP32", (-1, -1)),
    _t("generation_logits", "TYPE_FP32", (-1, -1, -1)),
)

# trtspec's additions: a per-request switch and drafter (none, ngram, suffix, lookahead, hybrid, the engine's own),
# lookahead's per-request (W, N, G) under tensorrtllm_backend's own tensorrt_llm input names (upstream's ensemble
# does not pass them on), the chat template per request (trtspec's own client asks for it, so its replies match
# in-process `generate`), the acceptance counters upstream lacks, the prompt's token count (a benchmark's input tokens), and the token ids (what tests and benchmarks
# compare exactly).
LOOKAHEAD_INPUTS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
TRTSPEC_INPUTS: tuple[Tensor, ...] = (
    _t("use_speculation", "TYPE_BOOL"),
    _t("draft_method", "TYPE_STRING"),
    *(_t(name, "TYPE_INT32") for name in LOOKAHEAD_INPUTS),
    _t("apply_chat_template", "TYPE_BOOL"),
)
TRTSPEC_OUTPUTS: tuple[Tensor, ...] = (
    _t("output_ids", "TYPE_INT32", (-1, -1)),  # [beams, tokens]
    _t("num_draft_tokens", "TYPE_INT32"),
    _t("num_accepted_tokens", "TYPE_INT32"),
    _t("num_verify_steps", "TYPE_INT32"),
    _t("steps_per_profile", "TYPE_STRING"),  # JSON: slot profile → verify steps run over it, so far
    _t("finish_reason", "TYPE_STRING"),
    _t("num_input_tokens", "TYPE_INT32"),  # the prompt's tokens as the engine received them (template applied)
    _t("position_acceptance", "TYPE_STRING"),  # JSON: {"trials": [...], "hits": [...]} per draft depth, so far
)


def client_inputs(*, newest_names: bool) -> tuple[Tensor, ...]:
    """The ensemble's request tensors with the spelling of one upstream generation (newest: min_tokens, seed)."""
    if not newest_names:
        return ENSEMBLE_INPUTS
    old_to_new = {old: new for new, old in RENAMED_INPUTS.items()}
    return tuple(Tensor(old_to_new.get(t.name, t.name), t.data_type, t.dims, optional=t.optional)
                 for t in ENSEMBLE_INPUTS)


def cpu_ensemble_inputs() -> tuple[Tensor, ...]:
    """The CPU flavour accepts both spellings of the renamed inputs, every other upstream input (to answer it), plus
    trtspec's own inputs."""
    renamed = tuple(t for t in client_inputs(newest_names=True) if t.name in RENAMED_INPUTS)
    return ENSEMBLE_INPUTS + renamed + UPSTREAM_EXTRA_INPUTS + TRTSPEC_INPUTS


def cpu_ensemble_outputs() -> tuple[Tensor, ...]:
    return ENSEMBLE_OUTPUTS + PERF_METRIC_OUTPUTS + NEVER_FILLED_OUTPUTS + TRTSPEC_OUTPUTS


# The ensemble's wiring, as upstream's `inflight_batcher_llm` does it (tensorrtllm_backend ensemble/config.pbtxt):
# client tensor → preprocessing input,
CLIENT_TO_PRE = {"text_input": "QUERY", "max_tokens": "REQUEST_OUTPUT_LEN", "bad_words": "BAD_WORDS_DICT",
                 "stop_words": "STOP_WORDS_DICT", "end_id": "END_ID", "pad_id": "PAD_ID"}
# client tensor → engine-model input where the names differ (the rest pass through by name),
CLIENT_TO_LLM = {"top_k": "runtime_top_k", "top_p": "runtime_top_p", "length_penalty": "len_penalty",
                 "stream": "streaming"}
# preprocessing output → (the ensemble's internal tensor, engine-model input).
PRE_TO_LLM = {"INPUT_ID": ("_INPUT_ID", "input_ids"), "REQUEST_INPUT_LEN": ("_REQUEST_INPUT_LEN", "input_lengths"),
              "REQUEST_OUTPUT_LEN": ("_REQUEST_OUTPUT_LEN", "request_output_len"),
              "STOP_WORDS_IDS": ("_STOP_WORDS_IDS", "stop_words_list"),
              "BAD_WORDS_IDS": ("_BAD_WORDS_IDS", "bad_words_list"),
              "OUT_END_ID": ("_PREPROCESSOR_END_ID", "end_id"), "OUT_PAD_ID": ("_PREPROCESSOR_PAD_ID", "pad_id")}
