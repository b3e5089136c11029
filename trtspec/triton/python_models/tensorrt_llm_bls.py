# trtspec CPU flavour: `tensorrt_llm_bls`, with the interface of tensorrtllm_backend's BLS model (the ensemble's
# request and response tensors plus draft-target's num_draft_tokens / use_draft_logits), for clients and curl
# examples written against it (`.../v2/models/tensorrt_llm_bls/generate`). On the CPU engine the speculative loop
# already runs inside the engine model, so this model relays each request to the `ensemble` (preprocessing →
# tensorrt_llm → postprocessing) through Triton's BLS API and sends its responses on. Written by `trtspec deploy`.
import os
import site
import sys

for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)  # the serving venv (the stub's embedded interpreter ignores PYTHONPATH)

import json  # noqa: E402
import threading  # noqa: E402

import triton_python_backend_utils as pb_utils  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# draft-target's knobs on upstream's BLS: the CPU engine drafts itself (its method and K come from the deployment)
DRAFT_TARGET_INPUTS = ("num_draft_tokens", "use_draft_logits")


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.outputs = [o["name"] for o in config["output"]]
        self.target = config.get("parameters", {}).get("ensemble_model", {}).get("string_value", "ensemble")

    def execute(self, requests):
        if not self.decoupled:
            return [self._unary(request) for request in requests]
        for request in requests:  # each request relayed on its own thread; execute returns at once
            threading.Thread(target=self._relay, args=(request,), name="trtspec-bls", daemon=True).start()
        return None

    def _forwarded(self, request):
        sent = {t.name(): t for t in request.inputs()}
        for name in DRAFT_TARGET_INPUTS:
            value = sent.pop(name, None)
            if name == "num_draft_tokens" and value is not None and int(value.as_numpy().reshape(-1)[0]) < 0:
                raise ValueError(f"num_draft_tokens must be >= 0, got {int(value.as_numpy().reshape(-1)[0])}")
        wanted = [n for n in (request.requested_output_names() or self.outputs) if n in self.outputs]
        return pb_utils.InferenceRequest(model_name=self.target, inputs=list(sent.values()),
                                         requested_output_names=wanted, request_id=request.request_id() or "")

    def _unary(self, request):
        try:
            response = self._forwarded(request).exec()
        except Exception as e:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {e}"))
        if response.has_error():
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error().message()))
        return pb_utils.InferenceResponse(response.output_tensors())

    def _relay(self, request):
        sender = request.get_response_sender()
        try:
            responses = self._forwarded(request).exec(decoupled=True)
            for response in responses:
                if response.has_error():
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(response.error().message())),
                                flags=FINAL)
                    return
                if response.output_tensors():
                    sender.send(pb_utils.InferenceResponse(response.output_tensors()))
                if sender.is_cancelled():  # the client went away: stop the ensemble request too, where it can be
                    cancel = getattr(responses, "cancel", None)
                    if cancel is not None:
                        cancel()
                    break
            sender.send(flags=FINAL)
        except Exception as e:
            pb_utils.Logger.log_error(f"tensorrt_llm_bls: {type(e).__name__}: {e}")
            try:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tensorrt_llm_bls: {e}")),
                            flags=FINAL)
            except Exception:
                pass
