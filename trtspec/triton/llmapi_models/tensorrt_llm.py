"""trtspec's LLM-API model (Triton Python backend): tensorrtllm_backend's llmapi contract over `tensorrt_llm.LLM`.

model.yaml (beside this file, or $LLM_CONFIG_PATH) holds the LLM's arguments and a `triton_config` section
(max_batch_size, decoupled) that auto_complete_config hands Triton and initialize drops before `LLM(**args)`, as
tensorrtllm_backend's llmapi model does. Tensors are that model's (all_models/llmapi/tensorrt_llm/config.pbtxt,
v0.19.0): text_input, streaming, sampling_param_*, return_* in; text_output, finish_reason, stop_reason,
cumulative_logprob out. Requests run concurrently through `LLM.generate_async`, so the LLM batches them in flight;
a decoupled model answers each from its own thread (streaming: one response per new piece of text).
"""

import json
import os
import threading

import numpy as np
import triton_python_backend_utils as pb_utils
import yaml

CONFIG_ENV = "LLM_CONFIG_PATH"
# request tensor → SamplingParams field (sampling_param_beam_width: beam search, refused above 1)
SAMPLING = {"sampling_param_temperature": ("temperature", float), "sampling_param_top_k": ("top_k", int),
            "sampling_param_top_p": ("top_p", float),
            "sampling_param_frequency_penalty": ("frequency_penalty", float),
            "sampling_param_presence_penalty": ("presence_penalty", float),
            "sampling_param_max_tokens": ("max_tokens", int), "sampling_param_seed": ("seed", int)}


def load_config():
    path = os.environ.get(CONFIG_ENV) or os.path.join(pb_utils.get_model_dir(), "model.yaml")
    with open(path) as f:
        config = yaml.safe_load(f)
    if not isinstance(config, dict) or not isinstance(config.get("triton_config"), dict):
        raise pb_utils.TritonModelException(f"{path}: expected a mapping with a triton_config section")
    return config


def llm_args(config):
    """The LLM's keyword arguments: model.yaml less its triton_config section."""
    return {k: v for k, v in config.items() if k != "triton_config"}


def scalar(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy().reshape(-1)[0]


def strings(request, name):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1)]


class TritonPythonModel:

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        triton_config = load_config()["triton_config"]
        auto_complete_model_config.set_model_transaction_policy(dict(decoupled=bool(triton_config["decoupled"])))
        auto_complete_model_config.set_max_batch_size(int(triton_config["max_batch_size"]))
        return auto_complete_model_config

    def initialize(self, args):
        from tensorrt_llm import LLM, SamplingParams

        config = load_config()
        self.decoupled = bool(config["triton_config"]["decoupled"])
        self.sampling_params = SamplingParams
        self.model_config = json.loads(args["model_config"])
        self.llm = LLM(**llm_args(config))
        self.threads = []

    def request(self, request):
        """(prompt, SamplingParams, streaming, exclude_input, which optional outputs) of one request."""
        prompts = strings(request, "text_input")
        if len(prompts) != 1:
            raise ValueError(f"text_input must hold one prompt, got {len(prompts)}")
        beam = scalar(request, "sampling_param_beam_width")
        if beam is not None and int(beam) > 1:
            raise ValueError("sampling_param_beam_width > 1: beam search does not run with speculative decoding")
        kwargs = {}
        for name, (field, cast) in SAMPLING.items():
            value = scalar(request, name)
            if value is not None:
                kwargs[field] = cast(value)
        stop = strings(request, "sampling_param_stop")
        if stop:
            kwargs["stop"] = stop
        exclude = scalar(request, "sampling_param_exclude_input_from_output")
        wants = {name: bool(scalar(request, f"return_{name}"))
                 for name in ("finish_reason", "stop_reason", "cumulative_logprob")}
        streaming = bool(scalar(request, "streaming")) if self.decoupled else False
        return prompts[0], self.sampling_params(**kwargs), streaming, exclude is None or bool(exclude), wants

    def response(self, output, text, wants):
        completion = output.outputs[0]
        tensors = [pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=object))]
        if wants["finish_reason"]:
            tensors.append(pb_utils.Tensor("finish_reason", np.array([str(completion.finish_reason)], dtype=object)))
        if wants["stop_reason"]:
            tensors.append(pb_utils.Tensor("stop_reason", np.array([str(completion.stop_reason)], dtype=object)))
        if wants["cumulative_logprob"]:
            tensors.append(pb_utils.Tensor("cumulative_logprob",
                                           np.array([completion.cumulative_logprob or 0.0], dtype=np.float32)))
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def execute(self, requests):
        if self.decoupled:
            for request in requests:
                thread = threading.Thread(target=self.serve_decoupled, args=(request,), daemon=True)
                thread.start()
                self.threads = [t for t in self.threads if t.is_alive()] + [thread]
            return None
        started = []
        for request in requests:
            try:
                prompt, params, _, exclude, wants = self.request(request)
                started.append((self.llm.generate_async(prompt, params), prompt, exclude, wants))
            except Exception as e:  # one bad request fails alone
                started.append(e)
        responses = []
        for item in started:
            if isinstance(item, Exception):
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(item))))
                continue
            future, prompt, exclude, wants = item
            try:
                output = future.result()
                text = output.outputs[0].text if exclude else prompt + output.outputs[0].text
                responses.append(self.response(output, text, wants))
            except Exception as e:
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))))
        return responses

    def serve_decoupled(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        try:
            prompt, params, streaming, exclude, wants = self.request(request)
            result = self.llm.generate_async(prompt, params, streaming=streaming)
            if not streaming:
                output = result.result()
                text = output.outputs[0].text if exclude else prompt + output.outputs[0].text
                sender.send(self.response(output, text, wants), flags=final)
                return
            sent, prefix = 0, "" if exclude else prompt
            for output in result:  # one RequestOutput per step: send the text it added
                text = output.outputs[0].text
                piece, sent, prefix = prefix + text[sent:], len(text), ""
                if piece:
                    sender.send(self.response(output, piece, wants))
            sender.send(flags=final)
        except Exception as e:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(str(e))), flags=final)

    def finalize(self):
        for thread in self.threads:
            thread.join(timeout=5)
        self.llm.shutdown()
