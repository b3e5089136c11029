"""trtspec preprocessing (TensorRT-LLM repository): text → token ids, stop / bad word lists, end and pad ids.

Tensor names follow tensorrtllm_backend's preprocessing model, so its ensemble wiring and clients apply.
Word lists use TensorRT-LLM's [B, 2, L] format: row 0 the concatenated ids (0-padded), row 1 each word's end
offset (-1-padded).
"""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

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
        queries = [q[0] if q else "" for q in decode_strings(query)]
        input_ids, lengths = encode_queries(self.tokenizer, queries, add_special_tokens=self.add_special_tokens,
                                            chat_template=self.chat_template, pad_id=self.pad_id)
        tensors = [pb_utils.Tensor("INPUT_ID", input_ids), pb_utils.Tensor("REQUEST_INPUT_LEN", lengths),
                   pb_utils.Tensor("REQUEST_OUTPUT_LEN", np.asarray(output_len, dtype=np.int32))]
        for source, target in (("BAD_WORDS_DICT", "BAD_WORDS_IDS"), ("STOP_WORDS_DICT", "STOP_WORDS_IDS")):
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            words = decode_strings(tensor.as_numpy()) if tensor is not None else [[] for _ in range(batch)]
            tensors.append(pb_utils.Tensor(target, word_list(self.tokenizer, words)))
        for source, target, default in (("END_ID", "OUT_END_ID", self.end_id), ("PAD_ID", "OUT_PAD_ID", self.pad_id)):
            tensor = pb_utils.get_input_tensor_by_name(request, source)
            value = tensor.as_numpy().astype(np.int32) if tensor is not None else np.full((batch, 1), default,
                                                                                         dtype=np.int32)
            tensors.append(pb_utils.Tensor(target, value))
        return tensors
