"""trtspec preprocessing (TensorRT-LLM repository): text → token ids, stop / bad word lists, embedding bias, end and
pad ids, and a decoder-only model's decoder inputs.

Tensor names, types and shapes follow tensorrtllm_backend's preprocessing model (all_models/inflight_batcher_llm/
preprocessing, v0.15-v0.19; TensorRT-LLM triton_backend/ from 1.0), so its ensemble wiring and clients apply
(end_to_end_test.py calls this model alone and hands DECODER_INPUT_ID to tensorrt_llm). Word lists use
TensorRT-LLM's [B, 2, L] format: row 0 the concatenated ids (0-padded), row 1 each word's end offset (-1-padded).
"""

import os
import site
import sys

# a rehearsal on a host without the TensorRT-LLM container (`deploy --rehearse`): the serving venv's packages, which
# the Python backend stub's embedded interpreter does not see otherwise; unset on a GPU host, where this does nothing
for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)

import json  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

TRUE = ("true", "1", "t", "y", "yes")


def parse_bool(text, default):
    if not text:  # absent or empty: the default
        return default
    return str(text).strip().lower() in TRUE


def model_parameters(args):
    config = json.loads(args["model_config"])
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def decode_strings(array):
    """[B, N] bytes / str → list of B lists of str (empty strings dropped)."""
    out = []
    for row in np.asarray(array, dtype=object).reshape(array.shape[0], -1):
        words = [w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in row]
        out.append([w for w in words if w])
    return out


def word_list(tokenizer, words_per_item):
    """B lists of words → int32 [B, 2, L] (ids; cumulative end offsets)."""
    rows = []
    for words in words_per_item:
        ids, offsets = [], []
        for word in words:
            ids += tokenizer.encode(word, add_special_tokens=False)
            offsets.append(len(ids))
        rows.append((ids, offsets))
    width = max([max(len(i), len(o)) for i, o in rows] + [0])
    out = np.zeros((len(rows), 2, width), dtype=np.int32)
    out[:, 1, :] = -1
    for b, (ids, offsets) in enumerate(rows):
        out[b, 0, :len(ids)] = ids
        out[b, 1, :len(offsets)] = offsets
    return out


def string_rows(array, batch):
    """[B, N] bytes / str → B lists of N str, positions kept (empty strings too)."""
    rows = np.asarray(array, dtype=object).reshape(batch, -1)
    return [[w.decode("utf-8") if isinstance(w, bytes) else str(w) for w in row] for row in rows]


def embedding_bias(tokenizer, vocab_size, words, weights, batch):
    """EMBEDDING_BIAS as upstream's preprocessing builds it (`_get_embedding_bias`): float32 [B, vocab], every token
    of each word gets that word's weight added (once per occurrence); [B, 0] without words, which tensorrt_llm reads
    as no bias (tensorrtllm_backend inflight_batcher_llm/src/utils.cc). Where trtspec differs: the width is the
    engine's vocab_size, which TensorRT-LLM's decoder requires (upstream takes the tokenizer's, which can differ);
    a word is encoded alone without special tokens (upstream's `tokenizer.encode(word)` would also bias a BOS),
    empty words are skipped. A half-sent pair or a count mismatch is refused in one line."""
    if words is None and weights is None:
        return np.zeros((batch, 0), dtype=np.float32)
    if words is None or weights is None:
        sent, missing = (("embedding_bias_words", "embedding_bias_weights") if weights is None
                         else ("embedding_bias_weights", "embedding_bias_words"))
        raise ValueError(f"{sent} was sent without {missing}; send both, one weight per word")
    rows = string_rows(words, batch)
    weights = np.asarray(weights, dtype=np.float32).reshape(batch, -1)
    bias = np.zeros((batch, vocab_size), dtype=np.float32)
    for b, row in enumerate(rows):
        if len(row) != weights.shape[1]:
            raise ValueError(f"embedding_bias_words has {len(row)} words and embedding_bias_weights "
                             f"{weights.shape[1]} weights; they must match one to one")
        for word, weight in zip(row, weights[b]):
            for token in tokenizer.encode(word, add_special_tokens=False) if word else ():
                if 0 <= token < vocab_size:
                    bias[b, token] += weight
    return bias


def prompt_table_extra_ids(input_ids, extra_id, vocab_size):
    """OUT_PROMPT_TABLE_EXTRA_IDS as upstream's preprocessing builds it: uint64 [B, L], the request's
    prompt_table_extra_id at each prompt-table position (an id >= vocab_size, TensorRT-LLM's p-tuning convention),
    0 elsewhere; tensorrt_llm uses it to key KV-cache reuse of prompt-table tokens."""
    extra = np.asarray(extra_id).astype(np.uint64).reshape(input_ids.shape[0], -1)
    if extra.shape[1] != 1:
        raise ValueError(f"prompt_table_extra_id takes one id per prompt, got {extra.shape[1]}")
    return np.where(input_ids >= vocab_size, extra, np.uint64(0)).astype(np.uint64)


def encode_queries(tokenizer, queries, *, add_special_tokens, chat_template, pad_id):
    """B prompts → (int32 [B, L] right-padded with pad_id, int32 [B, 1] lengths)."""
    encoded = []
    for text in queries:
        if chat_template:
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                                tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        else:
            ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if not ids:
            raise ValueError("text_input encodes to no tokens")
        encoded.append(ids)
    width = max(len(ids) for ids in encoded)
    input_ids = np.full((len(encoded), width), pad_id, dtype=np.int32)
    for b, ids in enumerate(encoded):
        input_ids[b, :len(ids)] = ids
    return input_ids, np.array([[len(ids)] for ids in encoded], dtype=np.int32)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        params = model_parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], legacy=False, padding_side="left",
                                                       trust_remote_code=True)
        self.add_special_tokens = parse_bool(params.get("add_special_tokens"), True)
        self.chat_template = parse_bool(params.get("apply_chat_template"), False) and bool(
            getattr(self.tokenizer, "chat_template", None))
        end = params.get("end_id", "")
        self.end_id = int(end) if end.lstrip("-").isdigit() else self.tokenizer.eos_token_id
        pad = params.get("pad_id", "")
        self.pad_id = int(pad) if pad.lstrip("-").isdigit() else (
            self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.end_id)
        vocab = params.get("vocab_size", "")
        self.vocab_size = int(vocab) if vocab.isdigit() else len(self.tokenizer)  # the engine's logits width

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self.preprocess(request)))
            except Exception as e:  # one bad request must not fail the batch
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses

    def preprocess(self, request):
        query = pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy()  # [B, 1] bytes
        batch = query.shape[0]
        output_len = pb_utils.get_input_tensor_by_name(request, "REQUEST_OUTPUT_LEN").as_numpy()
        decoder = pb_utils.get_input_tensor_by_name(request, "DECODER_QUERY")
        if decoder is not None and any(decode_strings(decoder.as_numpy())):
            # upstream tokenizes it into DECODER_INPUT_ID, which tensorrt_llm reads for encoder-decoder models only:
            # on this engine it would be dropped unread
            raise ValueError("decoder_text_input is for encoder-decoder models; this engine is decoder-only, send the "
                             "prompt as text_input")
        queries = [q[0] if q else "" for q in decode_strings(query)]
        input_ids, lengths = encode_queries(self.tokenizer, queries, add_special_tokens=self.add_special_tokens,
                                            chat_template=self.chat_template, pad_id=self.pad_id)
        tensors = [pb_utils.Tensor("INPUT_ID", input_ids), pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                   pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray(output_len, dtype=np.int32))]
        for source, target in (("BAD_WORDS_DICT", "BAD_WORDS_IDS"), ("STOP_WORDS_DICT", "STOP_WORDS_IDS")):
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            words = decode_strings(tensor.as_numpy()) if tensor is not None else [[] for _ in range(batch)]
            tensors.append(pb_utils.Tensor(target, word_list(self.tokenizer, words)))
        ids = {}
        for source, target, default in (("END_ID", "OUT_END_ID", self.end_id), ("PAD_ID", "OUT_PAD_ID", self.pad_id)):
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            value = tensor.as_numpy().astype(np.int32) if tensor is not None else np.full((batch, 1), default,
                                                                                         dtype=np.int32)
            ids[target] = value.reshape(batch, 1)
            tensors.append(pb_utils.Tensor(target, value))
        # a decoder-only model's decoder inputs, as upstream's preprocessing sends them without DECODER_QUERY: one
        # pad_id per prompt, length 1 (tensorrt_llm ignores them for decoder-only engines)
        tensors += [pb_utils.Tensor("DECODER_INPUT_ID", ids["OUT_PAD_ID"].copy()),
                    pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", np.ones((batch, 1), dtype=np.int32))]
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        words, weights = get("EMBEDDING_BIAS_WORDS"), get("EMBEDDING_BIAS_WEIGHTS")
        tensors.append(pb_utils.Tensor("EMBEDDING_BIAS", embedding_bias(
            self.tokenizer, self.vocab_size, words.as_numpy() if words is not None else None,
            weights.as_numpy() if weights is not None else None, batch)))
        extra = get("PROMPT_TABLE_EXTRA_ID")
        if extra is not None:  # only then, as upstream's
            tensors.append(pb_utils.Tensor("OUT_PROMPT_TABLE_EXTRA_IDS",
                                           prompt_table_extra_ids(input_ids, extra.as_numpy(), self.vocab_size)))
        return tensors
