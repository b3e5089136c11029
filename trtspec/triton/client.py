"""A gRPC client of a deployed trtspec (or tensorrtllm_backend) ensemble, over `tritonclient`.

Streams by default (the bidirectional gRPC stream: the only way to talk to a decoupled model), printing text as
it arrives, and returns the same record as local generation (`generate --json`): ids, text, finish reason and
acceptance statistics from trtspec's extra outputs.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from trtspec.errors import ConfigError, ServerError
from trtspec.speculative.loop import GenerationConfig

MODEL = "ensemble"
GRPC_PORT = 8001  # `trtspec serve`'s default gRPC port (server.ServerOptions.grpc_port), and Triton's


def grpc_address(url: str) -> str:
    """HOST:PORT to connect to: a bare HOST (or [IPv6]) gets `trtspec serve`'s default gRPC port."""
    url = url.strip()
    if url.startswith("["):  # [::1] or [::1]:8001
        return url if "]:" in url else f"{url}:{GRPC_PORT}"
    if url.count(":") > 1:  # a bare IPv6 address
        return f"[{url}]:{GRPC_PORT}"
    return url if ":" in url else f"{url}:{GRPC_PORT}"


@dataclass
class RemoteGeneration:
    """One prompt's result from the server, shaped like `trtspec.runtime.generator.Generation.to_dict()`."""

    prompt_index: int
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""
    steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    streamed: bool = True  # False: one response carried the whole reply, so there is no time to a first token
    responses: int = 0
    steps_per_profile: dict[str, int] = field(default_factory=dict)  # trtspec's CPU flavour reports it
    input_tokens: int | None = None  # the prompt's tokens as the server counted them (trtspec's CPU flavour)
    position_trials: list[int] = field(default_factory=list)  # per draft depth (trtspec's CPU flavour)
    position_hits: list[int] = field(default_factory=list)
    log_probs: list[float] | None = None  # output_log_probs, when the request asked for them

    def to_dict(self) -> dict:
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0
        length = 1 + self.accepted_tokens / self.steps if self.steps else 1.0
        tps = len(self.output_ids) / self.total_s if self.total_s else 0.0
        stats = {"steps": self.steps, "draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                 "acceptance_rate": round(rate, 4), "acceptance_length": round(length, 4),
                 "steps_per_profile": dict(self.steps_per_profile),
                 "ttft_ms": round(self.ttft_s * 1000, 2) if self.streamed else None,
                 "latency_ms": round(self.total_s * 1000, 2), "tokens_per_second": round(tps, 2)}
        record = {"prompt_index": self.prompt_index, "output_ids": self.output_ids, "text": self.text,
                  "finish_reason": self.finish_reason, "stats": stats}
        if self.log_probs is not None:
            record["log_probs"] = [round(v, 6) for v in self.log_probs]
        return record


def build_inputs(prompt: str, options: GenerationConfig, *, stream: bool, stop_words: list[str] = (),
                 accepted: set[str] | None = None, chat_template: bool = True) -> list:
    """The request tensors of the client contract for one prompt (batch 1).

    `accepted` (the model's input names, from its metadata) adapts to the deployment: `seed` where the ensemble
    has no `random_seed` (TensorRT-LLM ≥ 1.0), `return_perf_metrics` where it exists (GPU acceptance counters),
    and `use_speculation` only where the ensemble takes it (trtspec's CPU flavour). `chat_template`: whether the
    server renders the prompt as one user turn of the chat template (where the ensemble takes
    `apply_chat_template`; false sends the text as the prompt, as upstream's clients do)."""
    _check_sendable(options)

    def has(name: str) -> bool:
        return accepted is None or name in accepted

    tensor = infer_input

    inputs = [tensor("text_input", np.array([[prompt.encode()]], np.object_)),
              tensor("max_tokens", np.array([[options.max_tokens]], np.int32)),
              tensor("stream", np.array([[stream]], np.bool_)),
              tensor("exclude_input_in_output", np.array([[True]], np.bool_)),
              tensor("temperature", np.array([[options.sampling.temperature]], np.float32)),
              tensor("top_k", np.array([[options.sampling.top_k]], np.int32)),
              tensor("top_p", np.array([[options.sampling.top_p]], np.float32))]
    if has("apply_chat_template"):  # as in-process generate renders a text prompt (trtspec's CPU flavour)
        inputs.append(tensor("apply_chat_template", np.array([[chat_template]], np.bool_)))
    penalties = options.penalties
    for name, value, off in (("repetition_penalty", penalties.repetition, 1.0),
                             ("presence_penalty", penalties.presence, 0.0),
                             ("frequency_penalty", penalties.frequency, 0.0)):
        if value != off:  # TensorRT-LLM's tensors, with its semantics (speculative/penalties.py)
            if not has(name):
                raise ServerError(f"this deployment has no {name} input")
            inputs.append(tensor(name, np.array([[value]], np.float32)))
    if options.return_log_probs:
        if not has("return_log_probs"):
            raise ServerError("this deployment has no return_log_probs input")
        inputs.append(tensor("return_log_probs", np.array([[True]], np.bool_)))
    if options.sampling.seed is not None:
        name = "random_seed" if has("random_seed") else "seed"
        inputs.append(tensor(name, np.array([[options.sampling.seed]], np.uint64)))
    if options.no_spec:
        if not has("use_speculation"):
            raise ServerError("this deployment has no use_speculation input (TensorRT-LLM engines always decode "
                              "speculatively); --no-spec works against trtspec's CPU flavour")
        inputs.append(tensor("use_speculation", np.array([[False]], np.bool_)))
    if options.method is not None:
        if not has("draft_method"):
            raise ServerError("this deployment has no draft_method input (a TensorRT-LLM engine runs the method it "
                              "was built for); --method works against trtspec's CPU flavour")
        inputs.append(tensor("draft_method", np.array([[options.method.encode()]], np.object_)))
    if options.lookahead is not None:
        la = options.lookahead
        for name, value in (("lookahead_window_size", la.window_size), ("lookahead_ngram_size", la.ngram_size),
                            ("lookahead_verification_set_size", la.verification_set_size)):
            if not has(name):
                raise ServerError(f"this deployment has no {name} input; --lookahead works against a deployment "
                                  "that takes it (trtspec's CPU flavour)")
            inputs.append(tensor(name, np.array([[value]], np.int32)))
    if accepted is not None and "return_perf_metrics" in accepted and "use_speculation" not in accepted:
        # a TensorRT-LLM deployment: its acceptance counters come with the perf metrics (trtspec's CPU flavour
        # sends its own counters with every response)
        inputs.append(tensor("return_perf_metrics", np.array([[True]], np.bool_)))
    if stop_words:
        inputs.append(tensor("stop_words", np.array([[w.encode() for w in stop_words]], np.object_)))
    return inputs


# GenerationConfig fields the client contract has no tensor for (text stop words go as build_inputs' stop_words)
UNSENT_FIELDS = ("end_id", "stop_words", "bad_words", "min_tokens", "logit_bias", "acceptance",
                 "posterior_threshold", "posterior_alpha", "ngram")


def _check_sendable(options: GenerationConfig) -> None:
    """ConfigError naming the first field of options set away from its default that a request cannot carry."""
    default = GenerationConfig()
    for name in UNSENT_FIELDS:
        if getattr(options, name) != getattr(default, name):
            raise ConfigError(f"{name}={getattr(options, name)!r}: the gRPC client does not send it (the server "
                              "uses its own); leave it at its default")


def infer_input(name: str, array: np.ndarray):
    """One gRPC request tensor holding `array`, typed as Triton names its dtype (BYTES for object arrays)."""
    import tritonclient.grpc as grpcclient

    t = grpcclient.InferInput(name, list(array.shape), _wire_type(array))
    t.set_data_from_numpy(array)
    return t


def _wire_type(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    return np_to_triton_dtype(array.dtype)


class TritonClient:
    """One gRPC connection and stream; `generate` / `stream` may be called from one thread at a time per client.

    `connection`: the `tritonclient.grpc.InferenceServerClient` to use (default: one to `url`); `inputs`: the model's
    input names when the caller already read them (else read once from its metadata)."""

    def __init__(self, url: str, *, model: str = MODEL, timeout_s: float = 600.0, connection=None,
                 inputs: set[str] | None = None):
        url = grpc_address(url)
        if connection is None:
            import tritonclient.grpc as grpcclient

            connection = grpcclient.InferenceServerClient(url)
        self.url, self.model, self.timeout_s = url, model, timeout_s
        self._client = connection
        self._responses: dict[str, queue.Queue] = {}
        self._lock = threading.Lock()
        self._streaming = False
        self._inputs: set[str] | None = None if inputs is None else set(inputs)

    def model_inputs(self) -> set[str]:
        """The model's input names (cached), to speak to trtspec and tensorrtllm_backend ensembles alike."""
        if self._inputs is None:
            try:
                metadata = self._client.get_model_metadata(self.model)
            except Exception as e:
                raise ServerError(f"cannot read model {self.model!r} from {self.url} ({first_line(e)})") from None
            self._inputs = {t.name for t in metadata.inputs}
        return self._inputs

    def check_ready(self, *, wait_s: float = 0.0) -> None:
        """Raise ServerError unless the model is ready, waiting up to wait_s seconds for it (a starting server)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                ready, error = self._client.is_model_ready(self.model), None
            except Exception as e:
                ready, error = False, e
            if ready or time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        if error is not None:
            raise ServerError(f"cannot reach a Triton server at {self.url} ({first_line(error)}); start one with "
                              "`trtspec serve REPO`")
        if not ready:
            raise ServerError(f"model {self.model!r} is not ready on {self.url}")

    def _callback(self, result=None, error=None) -> None:
        request_id = None
        if result is not None:
            request_id = result.get_response().id
        elif error is not None:
            request_id = getattr(error, "request_id", None) or None
        with self._lock:
            targets = [self._responses[request_id]] if request_id in self._responses else list(
                self._responses.values())
        for q in targets[:1] if request_id else targets:
            q.put((result, error))

    def _ensure_stream(self) -> None:
        if not self._streaming:
            self._client.start_stream(callback=self._callback)
            self._streaming = True

    def generate(self, prompt: str, options: GenerationConfig = GenerationConfig(), *, index: int = 0,
                 stream: bool = True, on_text: Callable[[str], None] | None = None,
                 stop_words: list[str] = ()) -> RemoteGeneration:
        """Send one prompt on the bidirectional stream; collect (and pass on) text until the final response."""
        out = RemoteGeneration(index)
        start = time.perf_counter()
        for result in self._results(prompt, options, stream=stream, stop_words=stop_words, chat_template=True):
            self._absorb(out, result, on_text, start)
        return self._finished(out, start, stream=stream)

    def stream(self, prompt: str, options: GenerationConfig = GenerationConfig(), *, index: int = 0,
               stream: bool = True, stop_words: list[str] = (),
               chat_template: bool = True) -> Iterator[tuple[str, RemoteGeneration]]:
        """Send one prompt; yield (the new text, the record so far) for every response that carries outputs, until
        the final one (after it the record holds the totals). Closing the iterator before that cancels the request
        on the server (its gRPC stream ends with cancel_requests; the next request opens a new one).
        `chat_template`: see build_inputs."""
        out = RemoteGeneration(index)
        start = time.perf_counter()
        results = self._results(prompt, options, stream=stream, stop_words=stop_words, chat_template=chat_template)
        try:
            for result in results:
                pieces: list[str] = []
                self._absorb(out, result, pieces.append, start)
                out.total_s = time.perf_counter() - start
                yield "".join(pieces), out
        finally:
            results.close()  # at once, not when collected: an abandoned request is cancelled now
        self._finished(out, start, stream=stream)

    def _results(self, prompt: str, options: GenerationConfig, *, stream: bool, stop_words: list[str],
                 chat_template: bool) -> Iterator:
        """The InferResults of one request that carry outputs, until its final response; a ServerError (its
        __cause__ the tritonclient error, when there is one) for an error response or a timeout. Left before the
        final response (an error, or the caller closed the iterator), the request is cancelled."""
        self._ensure_stream()
        request_id = uuid.uuid4().hex
        responses: queue.Queue = queue.Queue()
        with self._lock:
            self._responses[request_id] = responses
        sent = ended = False
        try:
            inputs = build_inputs(prompt, options, stream=stream, stop_words=stop_words, accepted=self.model_inputs(),
                                  chat_template=chat_template)
            self._client.async_stream_infer(self.model, inputs,
                                            request_id=request_id, enable_empty_final_response=True)
            sent = True
            while True:
                try:
                    result, error = responses.get(timeout=self.timeout_s)
                except queue.Empty:
                    raise ServerError(f"no response from {self.url} within {self.timeout_s:.0f} s") from None
                if error is not None:
                    ended = True  # an error response is the request's last
                    raise ServerError(f"{self.url}: {first_line(error)}") from error
                response = result.get_response()
                final = response.parameters.get("triton_final_response")
                ended = bool(final and final.bool_param)
                if response.outputs:
                    yield result
                if ended:
                    break
        finally:
            with self._lock:
                self._responses.pop(request_id, None)
            if sent and not ended and self._streaming:  # abandoned: end it on the server too
                try:
                    self.cancel()
                except Exception:  # a connection already gone has nothing left to cancel
                    pass

    @staticmethod
    def _finished(out: RemoteGeneration, start: float, *, stream: bool) -> RemoteGeneration:
        out.total_s = time.perf_counter() - start
        out.streamed = stream
        if out.steps == 0 and out.draft_tokens and stream:
            out.steps = max(out.responses - 1, 1)  # TensorRT-LLM streams one response per decoding step
        return out

    @staticmethod
    def _absorb(out: RemoteGeneration, result, on_text, start: float) -> None:
        ids = result.as_numpy("output_ids")
        ids = [] if ids is None else ids.reshape(-1).tolist()
        if ids and not out.output_ids:
            out.ttft_s = time.perf_counter() - start
        out.output_ids += ids
        text = result.as_numpy("text_output")
        piece = b"".join(np.ravel(text)).decode("utf-8", errors="replace") if text is not None else ""
        out.text += piece
        if on_text is not None and piece:
            on_text(piece)
        for name, attr in (("num_verify_steps", "steps"), ("num_draft_tokens", "draft_tokens"),
                           ("num_accepted_tokens", "accepted_tokens"), ("total_draft_tokens", "draft_tokens"),
                           ("total_accepted_draft_tokens", "accepted_tokens"), ("num_input_tokens", "input_tokens")):
            value = result.as_numpy(name)
            if value is not None and value.size:
                setattr(out, attr, int(value.reshape(-1)[0]))
        positions = result.as_numpy("position_acceptance")
        if positions is not None and positions.size and positions.reshape(-1)[0]:
            counts = json.loads(positions.reshape(-1)[0])
            out.position_trials, out.position_hits = counts["trials"], counts["hits"]
        profiles = result.as_numpy("steps_per_profile")
        if profiles is not None and profiles.size and profiles.reshape(-1)[0]:
            out.steps_per_profile = json.loads(profiles.reshape(-1)[0])
        log_probs = result.as_numpy("output_log_probs")
        if log_probs is not None:  # [1, 1, tokens of this response]
            out.log_probs = (out.log_probs or []) + [float(v) for v in log_probs.reshape(-1)[:len(ids)]]
        reason = result.as_numpy("finish_reason")
        if reason is not None and reason.size and reason.reshape(-1)[0]:
            out.finish_reason = reason.reshape(-1)[0].decode()
        out.responses += 1

    def cancel(self) -> None:
        """End the stream and cancel its requests on the server, from any thread: a request waiting on it raises
        ServerError. The next request opens a new stream."""
        self._streaming = False
        self._client.stop_stream(cancel_requests=True)

    def close(self) -> None:
        if self._streaming:
            self._client.stop_stream()
            self._streaming = False
        self._client.close()

    def __enter__(self) -> TritonClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def generate_remote(url: str, prompts: list, options: GenerationConfig = GenerationConfig(), *,
                    model: str = MODEL, stream: bool = True, concurrency: int = 1, wait_s: float = 0.0,
                    on_text: Callable[[int, str], None] | None = None,
                    stop_words: list[str] = ()) -> Iterator[RemoteGeneration]:
    """Each prompt's reply from the server at `url` (waiting up to wait_s for it to be ready), in prompt order: one
    request at a time, a streamed reply's text passed to on_text(prompt index, piece) as it arrives, or
    `concurrency` at once (each on its own gRPC stream). `stop_words`: stop strings, sent as text."""
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ConfigError(f"prompt {i}: --url sends text prompts (\"prompt\"); chat messages and token ids "
                              "need a local ENGINE")
    with TritonClient(url, model=model) as client:
        client.check_ready(wait_s=wait_s)
        if concurrency == 1:
            for i, p in enumerate(prompts):
                yield client.generate(p, options, index=i, stream=stream, stop_words=list(stop_words),
                                      on_text=None if on_text is None else partial(on_text, i))
            return
    for result in generate_concurrently(url, prompts, options, concurrency=concurrency, stream=stream, model=model,
                                        stop_words=list(stop_words)):
        if isinstance(result, BaseException):
            raise result
        yield result


def generate_concurrently(url: str, prompts: list[str], options: GenerationConfig = GenerationConfig(), *,
                          concurrency: int = 8, stream: bool = True, model: str = MODEL,
                          options_for: Callable[[int], GenerationConfig] | None = None,
                          stop_words: list[str] = (), timeout_s: float = 600.0,
                          send: Callable[[TritonClient, int], object] | None = None) -> list[RemoteGeneration]:
    """Send every prompt with `concurrency` clients at once (each its own connection); results in prompt order.
    `send(client, i)`, when given, sends prompt i and returns its result instead of `client.generate`."""
    results: list[RemoteGeneration | BaseException | None] = [None] * len(prompts)
    next_index = iter(range(len(prompts)))
    lock = threading.Lock()

    def worker():
        with TritonClient(url, model=model, timeout_s=timeout_s) as client:
            while True:
                with lock:
                    i = next(next_index, None)
                if i is None:
                    return
                try:
                    results[i] = send(client, i) if send else client.generate(
                        prompts[i], options_for(i) if options_for else options, index=i, stream=stream,
                        stop_words=list(stop_words))
                except BaseException as e:  # reported per prompt
                    results[i] = e

    threads = [threading.Thread(target=worker) for _ in range(min(concurrency, len(prompts)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def first_line(error: BaseException, limit: int | None = None) -> str:
    """An error's first line (a tritonclient error's own message()), cut to `limit` characters."""
    text = error.message() if hasattr(error, "message") and callable(error.message) else str(error)
    return (text.strip().splitlines()[0] if text.strip() else type(error).__name__)[:limit]
