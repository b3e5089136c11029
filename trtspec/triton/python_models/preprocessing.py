# trtspec CPU flavour: preprocessing. Text → token ids (chat template optional), stop / bad word lists in
# TensorRT-LLM's [2, L] layout, end / pad ids from the tokenizer. Tensor names follow tensorrtllm_backend.
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
from trtspec.triton.text import encode_query, encode_word_lists  # noqa: E402




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

    def execute(self, requests):
        return [self._one(request) for request in requests]

    def _one(self, request):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        queries = get("QUERY").as_numpy()
        batch = queries.shape[0]
        ids = [encode_query(self.tokenizer, _strings(queries[b])[0], chat_template=self.chat_template,
                            add_special_tokens=self.add_special_tokens) for b in range(batch)]
        if any(len(x) == 0 for x in ids):
            return pb_utils.InferenceResponse(error=pb_utils.TritonError("text_input is empty (no tokens)"))
        pad_id = get("PAD_ID").as_numpy().reshape(batch, -1)[:, 0] if get("PAD_ID") is not None else None
        width = max(len(x) for x in ids)
        input_ids = np.full((batch, width), self.pad_id if pad_id is None else pad_id[0], np.int32)
        for b, row in enumerate(ids):
            input_ids[b, :len(row)] = row
        words = {}
        for name in ("STOP_WORDS_DICT", "BAD_WORDS_DICT"):
            tensor = get(name)
            lists = [_strings(tensor.as_numpy()[b]) if tensor is not None else [] for b in range(batch)]
            words[name] = encode_word_lists(self.tokenizer, lists)
        column = lambda values: np.asarray(values, np.int32).reshape(batch, 1)  # noqa: E731
        end = get("END_ID")
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("INPUT_ID", input_ids),
            pb_utils.Tensor("REQUEST_INPUT_LEN", column([len(x) for x in ids])),
            pb_utils.Tensor("REQUEST_OUTPUT_LEN", get("REQUEST_OUTPUT_LEN").as_numpy().astype(np.int32).reshape(batch, 1)),
            pb_utils.Tensor("STOP_WORDS_IDS", words["STOP_WORDS_DICT"]),
            pb_utils.Tensor("BAD_WORDS_IDS", words["BAD_WORDS_DICT"]),
            pb_utils.Tensor("OUT_END_ID", end.as_numpy().astype(np.int32).reshape(batch, 1) if end is not None
                            else column([self.end_id] * batch)),
            pb_utils.Tensor("OUT_PAD_ID", column([self.pad_id if pad_id is None else pad_id[0]] * batch)),
            # through the ensemble the engine reports a failure inside its final response, which postprocessing
            # turns into the error (see python_models/tensorrt_llm.py)
            pb_utils.Tensor("ERRORS_IN_BAND", np.ones((batch, 1), np.bool_)),
        ])
