# trtspec CPU flavour: preprocessing. Text → token ids, stop / bad word lists in TensorRT-LLM's [2, L] layout, the
# embedding bias over the vocabulary, end / pad ids from the tokenizer. Tensor names and shapes follow
# tensorrtllm_backend's preprocessing model. The prompt is the text the client sent, as upstream's; the chat template
# is applied only when the request sends apply_chat_template = true or the deployment turned it on
# (`deploy --chat-template`), and then ECHO_IDS carries the client's own text as ids, so an echoed reply
# (exclude_input_in_output = false) is text_input + completion either way.
import os
import site
import sys

for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)  # the serving venv (the stub's embedded interpreter ignores PYTHONPATH)

import json  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from trtspec.runtime.tokenizer import Tokenizer  # noqa: E402
from trtspec.triton.model_args import flag, model_path, parameter  # noqa: E402
from trtspec.triton.text import embedding_bias, encode_query, encode_word_lists  # noqa: E402




def _strings(array) -> list[str]:
    return [x.decode("utf-8", errors="replace") if isinstance(x, bytes) else str(x) for x in np.ravel(array)]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = Tokenizer.from_dir(model_path(args, config, "tokenizer_dir"))
        self.chat_template = flag(config, "chat_template", True)
        self.add_special_tokens = flag(config, "add_special_tokens", True)
        end = parameter(config, "end_id")
        pad = parameter(config, "pad_id")
        eos = self.tokenizer.eos_token_ids
        self.end_id = int(end) if end else (eos[0] if eos else -1)
        self.pad_id = int(pad) if pad else self.end_id
        self.vocab_size = int(parameter(config, "vocab_size", "0")) or self.tokenizer.vocab_size

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        queries = get("QUERY").as_numpy()
        batch = queries.shape[0]
        if get("DECODER_QUERY") is not None:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "decoder_text_input is for encoder-decoder models; this engine is decoder-only (send text_input)"))
        template = get("APPLY_CHAT_TEMPLATE")
        template = bool(template.as_numpy().reshape(-1)[0]) if template is not None else self.chat_template
        texts = [_strings(queries[b])[0] for b in range(batch)]
        ids = [encode_query(self.tokenizer, text, chat_template=template, add_special_tokens=self.add_special_tokens)
               for text in texts]
        if any(len(x) == 0 for x in ids):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("text_input is empty (no tokens)"))
        pad_id = get("PAD_ID").as_numpy().reshape(batch, -1)[:, 0] if get("PAD_ID") is not None else None
        pad = self.pad_id if pad_id is None else int(pad_id[0])
        width = max(len(x) for x in ids)
        input_ids = np.full((batch, width), pad, np.int32)
        for b, row in enumerate(ids):
            input_ids[b, :len(row)] = row
        # the client's text as ids when the prompt is not that text (the template around it): what an echo shows
        echo = ([self.tokenizer.encode(text, add_special_tokens=self.add_special_tokens) for text in texts]
                if template and self.tokenizer.chat_template is not None else [[] for _ in texts])
        echo_ids = np.full((batch, max(len(x) for x in echo)), -1, np.int32)
        for b, row in enumerate(echo):
            echo_ids[b, :len(row)] = row
        words = {}
        for name in ("STOP_WORDS_DICT", "BAD_WORDS_DICT"):
            tensor = get(name)
            lists = [_strings(tensor.as_numpy()[b]) if tensor is not None else [] for b in range(batch)]
            words[name] = encode_word_lists(self.tokenizer, lists)
        bias_words, bias_weights = get("EMBEDDING_BIAS_WORDS"), get("EMBEDDING_BIAS_WEIGHTS")
        if (bias_words is None) != (bias_weights is None):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "embedding_bias_words and embedding_bias_weights go together (one was sent without the other)"))
        try:
            bias = embedding_bias(self.tokenizer, self.vocab_size,
                                  [_strings(bias_words.as_numpy()[b]) for b in range(batch)] if bias_words is not None else None,
                                  bias_weights.as_numpy().reshape(batch, -1) if bias_weights is not None else None, batch)
        except ValueError as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e)))
        column = lambda values: np.asarray(values, np.int32).reshape(batch, 1)  # noqa: E731
        end = get("END_ID")
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", column([len(x) for x in ids])),
            # a decoder-only model's decoder inputs, as upstream's preprocessing sends them without DECODER_QUERY
            pb_utils.Tensor("DECODER_INPUT_ID", np.full((batch, 1), pad, np.int32)),
            pb_utils.Tensor("REQUEST_DECODER_INPUT_LEN", column([1] * batch)),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", get("REQUEST_OUTPUT_LEN").as_numpy().astype(np.int32).reshape(batch, 1)),
            pb_utils.Tensor("STOP_WORDS_IDS", words["STOP_WORDS_DICT"]),
            pb_utils.Tensor("BAD_WORDS_IDS", words["BAD_WORDS_DICT"]),
            pb_utils.Tensor("EMBEDDING_BIAS", bias),
            pb_utils.Tensor("OUT_END_ID", end.as_numpy().astype(np.int32).reshape(batch, 1) if end is not None
                            else column([self.end_id] * batch)),
            pb_utils.Tensor("OUT_PAD_ID", column([pad] * batch)),
            pb_utils.Tensor("ECHO_IDS", echo_ids),
            # through the ensemble the engine reports a failure inside its final response, which postprocessing
            # turns into the error (see python_models/tensorrt_llm.py)
            pb_utils.Tensor("ERRORS_IN_BAND", np.ones((batch, 1), np.bool_)),
        ])
