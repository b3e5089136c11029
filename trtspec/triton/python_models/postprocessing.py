# trtspec CPU flavour: postprocessing. Token ids → text. Streamed chunks carry the tokens before them
# (CONTEXT_IDS), so the delta text is exact across multi-byte characters without state between responses.
# OUTPUT is 1-D, one string per batch item and beam, as tensorrtllm_backend's postprocessing model sends it
# (`np.array(outputs)` over a flat list, whatever its config's dims say): NVIDIA's clients read
# `as_numpy("text_output")[0].decode()`.
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
from trtspec.triton.model_args import flag, model_path  # noqa: E402
from trtspec.triton.text import delta_text  # noqa: E402



class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.tokenizer = Tokenizer.from_dir(model_path(args, config, "tokenizer_dir"))
        self.skip_special = flag(config, "skip_special_tokens", True)

    def execute(self, requests):
        responses = []
        for request in requests:
            get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
            tokens = get("TOKENS_BATCH").as_numpy()  # [B, beams, L]
            lengths = get("SEQUENCE_LENGTH").as_numpy().reshape(tokens.shape[0], -1)
            context = get("CONTEXT_IDS")
            context = context.as_numpy().reshape(tokens.shape[0], -1) if context is not None else None
            final = get("IS_FINAL")
            final = final.as_numpy().reshape(-1) if final is not None else np.ones(tokens.shape[0], bool)
            texts = []
            for b in range(tokens.shape[0]):
                beams = tokens[b].reshape(-1, tokens.shape[-1])
                row = []
                for k in range(beams.shape[0]):
                    ids = beams[k, :int(lengths[b, min(k, lengths.shape[1] - 1)])].tolist()
                    before = context[b].tolist() if context is not None else []
                    row.append(delta_text(self.tokenizer, before, ids, final=bool(final[b]),
                                          skip_special_tokens=self.skip_special).encode("utf-8"))
                texts += row
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array(texts, np.object_))]))
        return responses
