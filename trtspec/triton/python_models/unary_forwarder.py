# trtspec CPU flavour, `deploy --no-decoupled`: the `tensorrt_llm` model unary clients call. Triton serves a
# non-decoupled Python model one execute at a time per instance, so an engine model of its own could only batch the
# requests that arrive in one execute, each waiting for the longest. Instead this thin model (one instance per
# batch row, no engine of its own) forwards each request to the decoupled engine model `trtspec_engine`, whose
# scheduler batches every request in flight, and answers with the engine's single response (`one_response`).
# Written by `trtspec deploy`; the engine's logic lives in trtspec.triton.serving.
import os
import site
import sys

for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)  # the serving venv (the stub's embedded interpreter ignores PYTHONPATH)

import json  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        params = config.get("parameters", {})
        self.engine = params.get("engine_model", {}).get("string_value", "trtspec_engine")
        self.outputs = [o["name"] for o in config["output"]]

    def execute(self, requests):
        return [self._forward(request) for request in requests]

    def _forward(self, request):
        inputs = [t for t in request.inputs() if t.name() != "one_response"]
        inputs.append(pb_utils.Tensor("one_response", np.ones((inputs[0].as_numpy().shape[0], 1), np.bool_)))
        wanted = request.requested_output_names() or self.outputs
        forwarded = pb_utils.InferenceRequest(model_name=self.engine, inputs=inputs,
                                              requested_output_names=list(wanted),
                                              request_id=request.request_id() or "")
        answer = None
        try:
            for response in forwarded.exec(decoupled=True):
                if response.has_error():
                    return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error().message()))
                if response.output_tensors():
                    answer = response
        except Exception as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"{self.engine}: {e}"))
        if answer is None:  # a stop request is answered with an empty response, as upstream's
            return pb_utils.InferenceResponse([])
        return pb_utils.InferenceResponse(answer.output_tensors())
