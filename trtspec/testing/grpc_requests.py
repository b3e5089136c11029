"""Raw gRPC requests as NVIDIA's clients send them (tritonclient only), for tests against a served repository."""

from __future__ import annotations

import threading

import numpy as np


def grpc_tensor(name: str, array: np.ndarray):
    """One request tensor with the Triton type of the array's dtype (BYTES for object arrays)."""
    from trtspec.triton.client import infer_input

    return infer_input(name, array)


def stream_once(url: str, model: str, inputs, timeout: float = 60, request_id: str = "", outputs=None):
    """Send one request on a gRPC stream and collect its responses until the final one; [(result, error)] of
    the responses that carry outputs or an error. Fails (AssertionError) when no final response comes in time."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(url)
    responses, done = [], threading.Event()

    def callback(result=None, error=None):
        responses.append((result, error))
        final = result is not None and result.get_response().parameters.get("triton_final_response")
        if error is not None or (final and final.bool_param):
            done.set()

    client.start_stream(callback=callback)
    client.async_stream_infer(model, inputs, enable_empty_final_response=True, request_id=request_id,
                              outputs=outputs)
    assert done.wait(timeout), f"no final response from {model} within {timeout} s"
    client.stop_stream()
    client.close()
    return [r for r in responses if r[1] is not None or r[0].get_response().outputs]
