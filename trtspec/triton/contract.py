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


# Request tensors of upstream's ensemble that a text client uses (multimodal, LoRA, prompt tuning and guided
# decoding inputs are not part of the speculative-decoding contract).
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

# Newest upstream spelling → the v0.19 spelling it replaces.
RENAMED_INPUTS = {"min_tokens": "min_length", "seed": "random_seed"}

ENSEMBLE_OUTPUTS: tuple[Tensor, ...] = (
    _t("text_output", "TYPE_STRING", (-1,)),
    _t("cum_log_probs", "TYPE_FP32", (-1,)),
    _t("output_log_probs", "TYPE_FP32", (-1, -1)),
    _t("batch_index", "TYPE_INT32"),
    _t("sequence_index", "TYPE_INT32"),
)

# trtspec's additions: a per-request switch and drafter (none, ngram, suffix, lookahead, hybrid, the engine's own),
# lookahead's per-request (W, N, G) under tensorrtllm_backend's own tensorrt_llm input names (upstream's ensemble
# does not pass them on), the acceptance counters upstream lacks, and the token ids (what tests and benchmarks
# compare exactly).
LOOKAHEAD_INPUTS = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
TRTSPEC_INPUTS: tuple[Tensor, ...] = (
    _t("use_speculation", "TYPE_BOOL"),
    _t("draft_method", "TYPE_STRING"),
    *(_t(name, "TYPE_INT32") for name in LOOKAHEAD_INPUTS),
)
TRTSPEC_OUTPUTS: tuple[Tensor, ...] = (
    _t("output_ids", "TYPE_INT32", (-1, -1)),  # [beams, tokens]
    _t("num_draft_tokens", "TYPE_INT32"),
    _t("num_accepted_tokens", "TYPE_INT32"),
    _t("num_verify_steps", "TYPE_INT32"),
    _t("steps_per_profile", "TYPE_STRING"),  # JSON: slot profile → verify steps run over it, so far
    _t("finish_reason", "TYPE_STRING"),
)


def client_inputs(*, newest_names: bool) -> tuple[Tensor, ...]:
    """The ensemble's request tensors with the spelling of one upstream generation (newest: min_tokens, seed)."""
    if not newest_names:
        return ENSEMBLE_INPUTS
    old_to_new = {old: new for new, old in RENAMED_INPUTS.items()}
    return tuple(Tensor(old_to_new.get(t.name, t.name), t.data_type, t.dims, optional=t.optional)
                 for t in ENSEMBLE_INPUTS)


def cpu_ensemble_inputs() -> tuple[Tensor, ...]:
    """The CPU flavour accepts both spellings of the renamed inputs, plus trtspec's own inputs."""
    renamed = tuple(t for t in client_inputs(newest_names=True) if t.name in RENAMED_INPUTS)
    return ENSEMBLE_INPUTS + renamed + TRTSPEC_INPUTS


def cpu_ensemble_outputs() -> tuple[Tensor, ...]:
    return ENSEMBLE_OUTPUTS + TRTSPEC_OUTPUTS


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
