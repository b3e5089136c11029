# trtspec CPU flavour: postprocessing. Token ids → text. Streamed chunks carry the tokens before them
# (CONTEXT_IDS), so the delta text is exact across multi-byte characters without state between responses.
# OUTPUT is 1-D, one string per batch item and beam, as tensorrtllm_backend's postprocessing model sends it
# (`np.array(outputs)` over a flat list, whatever its config's dims say): NVIDIA's clients read
# `as_numpy("text_output")[0].decode()`.
# It never answers with an error: Triton's ensemble (2.51) never finishes a request one of whose steps failed while
# another was in flight, so a failure here is logged and answered with empty text.
# A cancelled stream: Triton's ensemble marks only the steps it schedules after the cancellation, never the engine
# request already running, so this model is where a cancellation shows. It answers the cancelled request (an error
# would leave the ensemble in flight for ever in Triton before core#466) and sends the engine model a stop request
# (tensorrtllm_backend's `stop` input) naming the engine request's STOP_REQUEST_ID, which ends it within a step.
import os
import site
import sys

for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)  # the serving venv (the stub's embedded interpreter ignores PYTHONPATH)

import collections  # noqa: E402
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
        self.engine_model = "tensorrt_llm"
        self._stopped = collections.deque(maxlen=256)  # keys already stopped (a stream has several cancelled steps)

    def _forward_stop(self, key: str) -> None:
        if not key or key in self._stopped:
            return
        self._stopped.append(key)
        scalar = lambda name, value, dtype: pb_utils.Tensor(name, np.array([[value]], dtype))  # noqa: E731
        stop = pb_utils.InferenceRequest(
            model_name=self.engine_model, request_id=key, requested_output_names=[],
            inputs=[scalar("input_ids", 0, np.int32), scalar("input_lengths", 0, np.int32),
                    scalar("request_output_len", 0, np.int32), scalar("stop", True, np.bool_)])
        try:
            for response in stop.exec(decoupled=True):
                if response.has_error():
                    pb_utils.Logger.log_warn(f"stopping {key}: {response.error().message()}")
        except Exception as e:  # the engine model is not decoupled: stop it with a unary call
            try:
                response = stop.exec()
                if response.has_error():
                    pb_utils.Logger.log_warn(f"stopping {key}: {response.error().message()}")
            except Exception:
                pb_utils.Logger.log_warn(f"stopping {key}: {e}")

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                responses.append(self._one(request))
            except Exception as e:  # an error here would leave the ensemble request in flight for ever (2.51)
                pb_utils.Logger.log_error(f"postprocessing: {type(e).__name__}: {e}")
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([b""], np.object_))]))
        return responses

    def _one(self, request):
        get = lambda name: pb_utils.get_input_tensor_by_name(request, name)  # noqa: E731
        tokens = get("TOKENS_BATCH").as_numpy()  # [B, beams, L]
        empty = np.array([b""] * (tokens.shape[0] * tokens.shape[1]), np.object_)
        if request.is_cancelled():  # nobody reads this response; the engine must stop computing for it
            final = get("IS_FINAL")
            if final is None or not final.as_numpy().all():
                key = get("STOP_REQUEST_ID")
                for value in (key.as_numpy().reshape(-1) if key is not None else ()):
                    self._forward_stop(value.decode() if isinstance(value, bytes) else str(value))
            return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", empty)])
        lengths = get("SEQUENCE_LENGTH").as_numpy().reshape(tokens.shape[0], -1)
        context = get("CONTEXT_IDS")
        context = context.as_numpy().reshape(tokens.shape[0], -1) if context is not None else None
        final = get("IS_FINAL")
        final = final.as_numpy().reshape(-1) if final is not None else np.ones(tokens.shape[0], bool)
        texts = []
        for b in range(tokens.shape[0]):
            beams = tokens[b] if tokens.ndim == 3 else tokens[b].reshape(1, -1)
            row = []
            for k in range(beams.shape[0]):
                ids = beams[k, :int(lengths[b, min(k, lengths.shape[1] - 1)])].tolist()
                before = context[b].tolist() if context is not None else []
                row.append(delta_text(self.tokenizer, before, ids, final=bool(final[b]),
                                      skip_special_tokens=self.skip_special).encode("utf-8"))
            texts += row
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array(texts, np.object_))])
