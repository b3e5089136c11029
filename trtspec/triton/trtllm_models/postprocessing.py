"""trtspec postprocessing (TensorRT-LLM repository): token ids → text, one string per beam.

Each response is decoded on its own (a streamed response carries only its new tokens). OUTPUT is 1-D (batch x
beams strings), as upstream's postprocessing model sends it whatever its config's dims say, and as NVIDIA's clients
read it (`as_numpy("text_output")[0].decode()`).
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


def detokenize(tokenizer, tokens, lengths, *, skip_special_tokens):
    """tokens int [B, beams, L], lengths [B, beams] → object [B x beams] utf-8 bytes (the ids themselves reach the
    client as tensorrt_llm sends them, [1, beams, L], through the ensemble's output_ids)."""
    tokens, lengths = np.asarray(tokens), np.asarray(lengths).reshape(tokens.shape[0], -1)
    texts = np.empty(lengths.shape, dtype=object)
    for b in range(tokens.shape[0]):
        for beam in range(lengths.shape[1]):
            ids = tokens[b, beam, :max(int(lengths[b, beam]), 0)].tolist()
            texts[b, beam] = tokenizer.decode(ids, skip_special_tokens=skip_special_tokens).encode("utf-8")
    return texts.reshape(-1)


class TritonPythonModel:
    def initialize(self, args):
        from transformers import AutoTokenizer

        config = json.loads(args["model_config"])
        params = {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}
        self.tokenizer = AutoTokenizer.from_pretrained(params["tokenizer_dir"], legacy=False, padding_side="left",
                                                       trust_remote_code=True)
        self.skip_special_tokens = params.get("skip_special_tokens", "true").strip().lower() in TRUE

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
                lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
                texts = detokenize(self.tokenizer, tokens, lengths, skip_special_tokens=self.skip_special_tokens)
                responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT", texts)]))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses
