"""An OpenAI-compatible HTTP API in front of a served deployment, over the ensemble's gRPC.

`GET /v1/models`, `POST /v1/completions` and `POST /v1/chat/completions`, each streamed as server-sent events
(`stream: true`) or not, with `usage` and trtspec's acceptance statistics in `usage.trtspec`. Triton's own OpenAI
frontend needs the in-process `tritonserver` bindings (wheels only for Python 3.12 on glibc >= 2.39, and they host
the models themselves); this one is a thin translator to the contract of docs/triton-contract.md on the standard
library's threaded HTTP server, so the serving path gains no dependency. A request's sampling fields keep OpenAI's
meaning (temperature 1 samples; 0 is greedy), which the frontend spells out in TensorRT-LLM's terms. Stop strings
are applied here on the text (the ensemble's stop words are token sequences and stay in the reply): the text ends
before the first one, held back while it may still become one, and the request is cancelled on the server.
Chat messages are rendered with the model's chat template by the frontend when it has the tokenizer, else one user
message goes to the deployment's own template (`apply_chat_template`).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from trtspec.errors import ConfigError, ServerError, TrtspecError
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.sampling import SamplingParams
from trtspec.triton.client import MODEL, RemoteGeneration, TritonClient

log = logging.getLogger(__name__)

DEFAULT_PORT = 9000  # as Triton's own OpenAI frontend
COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_MAX_TOKENS = 512  # chat without max_tokens when the engine's room is unknown (else: up to its max_seq_len)
MAX_BODY = 16 << 20
IDLE_CLIENTS = 16  # gRPC connections kept for the next requests
# the engine's finish reason → OpenAI's ("abort": the server ended the request, e.g. its drain time was over)
FINISH = {"length": "length", "end_id": "stop", "stop_word": "stop", "cancelled": "abort"}
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclass
class Call:
    """One parsed request: what to send the ensemble and how to answer."""

    chat: bool
    prompt: str  # text_input
    chat_template: bool  # the deployment renders it (one user message, no tokenizer here)
    options: GenerationConfig
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    echo: str = ""  # completions' echo: the prompt, before the completion
    prompt_tokens: int | None = None  # counted here (with the tokenizer), when the server does not say


@dataclass
class Outcome:
    """A finished run: its text, OpenAI's finish reason and the server's record."""

    text: str = ""
    finish_reason: str = "stop"
    record: RemoteGeneration = field(default_factory=lambda: RemoteGeneration(0))


class StopScanner:
    """OpenAI's stop strings on streamed text: pass on what cannot be the start of one, end before the first."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = tuple(s for s in stops if s)
        self.text, self.sent, self.hit = "", 0, False

    def feed(self, piece: str) -> str:
        """The text `piece` lets through (a stop string found: up to it, and `hit` is set)."""
        self.text += piece
        if not self.stops:
            return self._emit(len(self.text))
        found = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if found:
            self.hit = True
            return self._emit(min(found))
        held = max((k for s in self.stops for k in range(1, min(len(s), len(self.text) - self.sent + 1))
                    if self.text.endswith(s[:k])), default=0)
        return self._emit(len(self.text) - held)

    def flush(self) -> str:
        """What was held back, at the end of the reply (no stop string came)."""
        return "" if self.hit else self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out


class OpenAIFrontend:
    """The translation: OpenAI requests → the ensemble's gRPC requests (one gRPC stream each) → OpenAI answers.

    `connect()` makes a `tritonclient.grpc.InferenceServerClient` (default: to `url`); tests pass a stand-in.
    `tokenizer` (trtspec's Tokenizer, the deployment's) renders chats and counts prompts here; `max_seq_len` (the
    engine's) lets a chat without max_tokens run until the engine's room is used up."""

    def __init__(self, url: str, *, model: str = MODEL, served_model_name: str | None = None, tokenizer=None,
                 max_seq_len: int | None = None, connect=None, timeout_s: float = 600.0):
        self.url, self.model = url, model
        self.name = served_model_name or model
        self.tokenizer, self.max_seq_len, self.timeout_s = tokenizer, max_seq_len, timeout_s
        if connect is None:
            import tritonclient.grpc as grpcclient

            connect = lambda: grpcclient.InferenceServerClient(url)  # noqa: E731
        self.connect = connect
        self.created = int(time.time())
        self.inputs: set[str] | None = None
        self.streaming = True  # the deployment streams (decoupled); else each request is answered once
        self._idle: queue.LifoQueue = queue.LifoQueue()

    @classmethod
    def for_repository(cls, repo: Path, url: str, **kwargs) -> OpenAIFrontend:
        """A frontend for the deployment in model repository `repo`, served at `url`: its tokenizer and max_seq_len
        read from the repository."""
        tokenizer_dir, max_seq_len = deployment_files(repo)
        tokenizer = None
        if tokenizer_dir is not None:
            from trtspec.runtime.tokenizer import Tokenizer

            tokenizer = Tokenizer.from_dir(tokenizer_dir)
        return cls(url, tokenizer=tokenizer, max_seq_len=max_seq_len, **kwargs)

    def check(self, *, wait_s: float = 0.0) -> OpenAIFrontend:
        """Wait (up to wait_s) for the model to be ready; read its inputs and whether it streams."""
        connection = self.connect()
        probe = TritonClient(self.url, model=self.model, connection=connection)
        try:
            probe.check_ready(wait_s=wait_s)
            self.inputs = probe.model_inputs()
            try:  # the engine model says whether the deployment streams (`deploy --no-decoupled` does not)
                config = connection.get_model_config("tensorrt_llm").config
                self.streaming = bool(config.model_transaction_policy.decoupled)
            except Exception:
                self.streaming = True
        finally:
            probe.close()
        return self

    # ---- requests -----------------------------------------------------------------------------------------------

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "trtspec"}

    def parse(self, body: object, *, chat: bool) -> Call:
        """A request body → Call, or APIError naming the field that cannot be served."""
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise _bad("you must provide a model parameter (this server serves "
                       f"{self.name!r})", "model")
        if model != self.name:
            raise APIError(404, f"The model {model!r} does not exist; this server serves {self.name!r}",
                           param="model", code="model_not_found")
        n = body.get("n")
        if n is not None and n != 1:
            raise _bad(f"n = {n!r}: one choice per request (n = 1) is supported; send n requests instead", "n")
        _refuse(body, chat)
        if chat:
            prompt, template, counted = self._chat_prompt(body.get("messages"))
        else:
            prompt, template, counted = self._completion_prompt(body.get("prompt"))
        max_tokens = body.get("max_completion_tokens") if chat else None
        max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
        if max_tokens is None:
            max_tokens = self._default_max_tokens(counted) if chat else COMPLETION_MAX_TOKENS
        max_tokens = _integer(max_tokens, "max_tokens", low=1)
        stream = _boolean(body.get("stream", False), "stream")
        usage = body.get("stream_options") or {}
        if not isinstance(usage, dict):
            raise _bad("stream_options must be an object", "stream_options")
        method, speculate = body.get("draft_method"), body.get("use_speculation", True)
        if method is not None and not isinstance(method, str):
            raise _bad("draft_method must be a string (none, ngram, suffix, lookahead, hybrid or the engine's own)",
                       "draft_method")
        try:
            options = GenerationConfig(max_tokens=max_tokens, sampling=_sampling(body), method=method or None,
                                       no_spec=not _boolean(speculate, "use_speculation"))
        except ConfigError as e:
            raise _bad(str(e)) from None
        echo = not chat and _boolean(body.get("echo", False), "echo")
        return Call(chat, prompt, template, options, stop=_stops(body.get("stop")), stream=stream,
                    include_usage=_boolean(usage.get("include_usage", False), "stream_options.include_usage"),
                    echo=prompt if echo else "", prompt_tokens=counted)

    def _completion_prompt(self, prompt) -> tuple[str, bool, int | None]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list):
            raise _bad("prompt: one text prompt per request is supported (not a batch, not token ids)", "prompt")
        if not isinstance(prompt, str) or not prompt:
            raise _bad("prompt must be a non-empty string", "prompt")
        counted = None if self.tokenizer is None else len(self.tokenizer.encode(prompt, add_special_tokens=True))
        return prompt, False, counted

    def _chat_prompt(self, messages) -> tuple[str, bool, int | None]:
        """The chat as the text to send: rendered here with the tokenizer's template (as the text whose encoding
        by the deployment's preprocessing, special tokens added, gives the rendered chat's ids), or one user
        message for the deployment's own template."""
        if not isinstance(messages, list) or not messages:
            raise _bad("messages must be a non-empty list", "messages")
        chat = [_message(m, i) for i, m in enumerate(messages)]
        single = len(chat) == 1 and chat[0]["role"] == "user"
        can_template = self.inputs is None or "apply_chat_template" in self.inputs
        if self.tokenizer is not None and self.tokenizer.chat_template:
            try:
                ids = self.tokenizer.encode_chat(chat)
                text = self.tokenizer.apply_chat_template(chat)
            except TrtspecError as e:
                raise _bad(str(e), "messages") from None
            bos = self.tokenizer.special_tokens.get("bos_token")
            for candidate in (text, text[len(bos):] if bos and text.startswith(bos) else None):
                if candidate and self.tokenizer.encode(candidate, add_special_tokens=True) == ids:
                    return candidate, False, len(ids)
            if single and can_template:
                return chat[0]["content"], True, len(ids)
            return text, False, len(ids)
        if single and can_template:
            return chat[0]["content"], True, None
        raise _bad("this server renders a chat of one user message only (it was started without the model's "
                   "tokenizer: `trtspec openai --tokenizer`)", "messages")

    def _default_max_tokens(self, prompt_tokens: int | None) -> int:
        if self.max_seq_len is not None and prompt_tokens is not None:
            return max(1, self.max_seq_len - prompt_tokens)
        return CHAT_MAX_TOKENS

    @contextmanager
    def _client(self) -> Iterator[TritonClient]:
        try:
            client = self._idle.get_nowait()
        except queue.Empty:
            client = TritonClient(self.url, model=self.model, connection=self.connect(), inputs=self.inputs,
                                  timeout_s=self.timeout_s)
        try:
            yield client
        except BaseException:
            client.close()
            raise
        if self._idle.qsize() < IDLE_CLIENTS:
            self._idle.put(client)
        else:
            client.close()

    def run(self, call: Call, outcome: Outcome) -> Iterator[str]:
        """The reply's text as it comes (stop strings applied); `outcome` holds the totals once it is exhausted.
        Closing it early cancels the request on the server."""
        scanner = StopScanner(call.stop)
        with self._client() as client:
            replies = client.stream(call.prompt, call.options, stream=self.streaming, stop_words=list(scanner.stops),
                                    chat_template=call.chat_template)
            try:
                for piece, record in replies:
                    outcome.record = record
                    text = scanner.feed(piece)
                    if text:
                        outcome.text += text
                        yield text
                    if scanner.hit:
                        outcome.finish_reason = "stop"
                        return  # closing `replies` cancels the rest on the server
                text = scanner.flush()
                outcome.text += text
                outcome.finish_reason = FINISH.get(outcome.record.finish_reason, "stop")
                if text:
                    yield text
            except ServerError as e:
                raise _upstream(e) from None
            finally:
                replies.close()

    def usage(self, call: Call, outcome: Outcome) -> dict:
        r = outcome.record
        prompt = r.input_tokens if r.input_tokens is not None else (call.prompt_tokens or 0)
        stats = r.to_dict()["stats"]
        return {"prompt_tokens": prompt, "completion_tokens": len(r.output_ids),
                "total_tokens": prompt + len(r.output_ids),
                "trtspec": {key: stats[key] for key in ("steps", "draft_tokens", "accepted_tokens", "acceptance_rate",
                                                         "acceptance_length")}}

    def answer(self, call: Call, outcome: Outcome, request_id: str) -> dict:
        """The non-streamed reply."""
        text = call.echo + outcome.text
        head = {"id": request_id, "created": int(time.time()), "model": self.name, "system_fingerprint": None}
        if call.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": outcome.finish_reason}
            return {**head, "object": "chat.completion", "choices": [choice], "usage": self.usage(call, outcome)}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": outcome.finish_reason}
        return {**head, "object": "text_completion", "choices": [choice], "usage": self.usage(call, outcome)}

    def chunks(self, call: Call, request_id: str) -> Iterator[dict]:
        """The streamed reply's chunks (the first pulled before any is sent, so a refused request is an HTTP
        error, not a stream); closing it early cancels the request."""
        outcome = Outcome()
        created = int(time.time())
        head = {"id": request_id, "created": created, "model": self.name, "system_fingerprint": None,
                "object": "chat.completion.chunk" if call.chat else "text_completion"}

        def chunk(text: str | None, finish: str | None = None, *, role: bool = False) -> dict:
            if call.chat:
                delta = ({"role": "assistant", "content": ""} if role else
                         {} if text is None else {"content": text})
                return {**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return {**head, "choices": [{"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}]}

        pieces = self.run(call, outcome)
        try:
            first = next(pieces, None)  # errors before the stream starts surface here
            if call.chat:
                yield chunk(None, role=True)
            if call.echo:
                yield chunk(call.echo)
            if first is not None:
                yield chunk(first)
                for piece in pieces:
                    yield chunk(piece)
            yield chunk(None, outcome.finish_reason)
            if call.include_usage:
                yield {**head, "choices": [], "usage": self.usage(call, outcome)}
        finally:
            pieces.close()

    def close(self) -> None:
        while True:
            try:
                self._idle.get_nowait().close()
            except queue.Empty:
                return
            except Exception:
                log.debug("closing a gRPC client failed", exc_info=True)


def _refuse(body: dict, chat: bool) -> None:
    """APIError for an OpenAI field set to what the CPU / TensorRT-LLM engines cannot do here."""
    unsupported = {
        "best_of": lambda v: v not in (None, 1),
        "logprobs": lambda v: v not in (None, False) if chat else v is not None,
        "top_logprobs": lambda v: v not in (None, 0),
        "presence_penalty": lambda v: v not in (None, 0, 0.0),
        "frequency_penalty": lambda v: v not in (None, 0, 0.0),
        "logit_bias": lambda v: bool(v),
        "suffix": lambda v: bool(v),
        "tools": lambda v: bool(v),
        "functions": lambda v: bool(v),
        "tool_choice": lambda v: v not in (None, "none"),
        "function_call": lambda v: v not in (None, "none"),
        "response_format": lambda v: v not in (None, {"type": "text"}),
    }
    for name, refused in unsupported.items():
        if name in body and refused(body[name]):
            raise _bad(f"{name} = {json.dumps(body[name])[:80]} is not supported by this server "
                       "(trtspec's OpenAI frontend)", name)


def _sampling(body: dict) -> SamplingParams:
    """OpenAI's temperature (default 1: sampling), top_p (default 1) and vLLM's top_k (0 or -1: off), seed."""
    temperature = _number(body.get("temperature", 1.0), "temperature", low=0.0)
    top_p = _number(body.get("top_p", 1.0), "top_p", low=0.0, high=1.0)
    top_k = _integer(body.get("top_k", 0), "top_k", low=-1)
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(seed, "seed", low=0, high=2**64 - 1)
    if top_p == 0.0:  # only the most likely token survives
        temperature, top_p = 0.0, 1.0
    return SamplingParams(temperature=temperature, top_k=max(top_k, 0), top_p=top_p, seed=seed)


def _stops(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise _bad("stop must be a string or a list of strings", "stop")
    return tuple(s for s in stop if s)


def _message(message, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _bad(f"{where} must be an object with role and content", "messages")
    role = ROLES.get(message.get("role"))
    if role is None:
        raise _bad(f"{where}.role = {message.get('role')!r}: system, developer, user or assistant messages are "
                   "supported (not tool calls)", "messages")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _bad(f"{where}.content: only text parts are supported, not {kind!r}", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise _bad(f"{where}.content must be a string or a list of text parts", "messages")
    return {"role": role, "content": content}


def _number(value, name: str, *, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise _bad(f"{name} must be a number, got {json.dumps(value)}", name)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise _bad(f"{name} = {value} is out of range (it must be {bounds})", name)
    return float(value)


def _integer(value, name: str, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"{name} must be an integer, got {json.dumps(value)}", name)
    if value < low or (high is not None and value > high):
        raise _bad(f"{name} = {value} is out of range (it must be >= {low}"
                   f"{f' and <= {high}' if high is not None else ''})", name)
    return value


def _boolean(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise _bad(f"{name} must be true or false, got {json.dumps(value)}", name)
    return value


def _upstream(error: ServerError) -> APIError:
    """A failed gRPC request as the HTTP answer: refused by the deployment (bad input) 400; the server unreachable
    or stopping 503; no answer in time 504; anything else 502."""
    cause, message = error.__cause__, str(error)
    status = cause.status() if cause is not None and hasattr(cause, "status") else None
    if "no response from" in message:
        return APIError(504, message, type="server_error", code="timeout")
    if status is not None and "UNAVAILABLE" in str(status):
        return APIError(503, f"the Triton server is unavailable: {message}", type="server_error", code="unavailable")
    if "shutting down" in message:
        return APIError(503, message, type="server_error", code="unavailable")
    if cause is None or status is None or "INVALID_ARGUMENT" in str(status):  # the model answered with an error
        return APIError(400, message)
    return APIError(502, message, type="server_error", code="upstream_error")


def deployment_files(repo: Path) -> tuple[Path | None, int | None]:
    """A model repository's tokenizer folder (preprocessing's tokenizer_dir) and its engine's max_seq_len (the CPU
    flavour's manifest, or a TensorRT-LLM engine's config.json), each None where the repository does not say."""
    repo = Path(repo)
    params = {name: _parameters(repo / name / "config.pbtxt") for name in ("preprocessing", "tensorrt_llm",
                                                                          "trtspec_engine")}
    tokenizer = None
    if value := params["preprocessing"].get("tokenizer_dir"):
        path = Path(value) if Path(value).is_absolute() else repo / "preprocessing" / value
        tokenizer = path if (path / "tokenizer.json").is_file() else None
    max_seq_len = None
    engine = params["tensorrt_llm"].get("engine_dir") or params["trtspec_engine"].get("engine_dir")
    if engine:
        from trtspec.engine.manifest import read_manifest
        from trtspec.triton.model_args import repository_path

        try:
            max_seq_len = read_manifest(repository_path(repo, engine)).profile.max_seq_len
        except TrtspecError:
            pass
    elif value := params["tensorrt_llm"].get("gpt_model_path"):
        try:
            config = json.loads((Path(value) / "config.json").read_text())
            max_seq_len = int(config["build_config"]["max_seq_len"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return tokenizer, max_seq_len


def _parameters(config_path: Path) -> dict[str, str]:
    """A config.pbtxt's `parameters` (string values; unfilled `${...}` placeholders left out); {} without one."""
    if not config_path.is_file():
        return {}
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    try:
        config = text_format.Parse(config_path.read_text(), model_config_pb2.ModelConfig())
    except text_format.ParseError:
        return {}
    return {k: v.string_value for k, v in config.parameters.items() if not v.string_value.startswith("${")}


# ---- HTTP ------------------------------------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive; streams are sent chunked
    server_version = "trtspec-openai"
    frontend: OpenAIFrontend  # set on the subclass the server makes

    def log_message(self, format, *args) -> None:  # noqa: A002 (BaseHTTPRequestHandler's name)
        log.debug("%s %s", self.address_string(), format % args)

    def do_GET(self) -> None:  # noqa: N802
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        routes = {"/v1/models": ("GET", self._models), "/v1/completions": ("POST", self._completions),
                  "/v1/chat/completions": ("POST", self._chat), "/health": ("GET", self._health)}
        try:
            self._raw = self._read_body()  # before any answer: the connection stays usable for the next request
            if path.startswith("/v1/models/"):
                if method != "GET":
                    raise APIError(405, f"{method} {path}: use GET")
                return self._model(path.removeprefix("/v1/models/"))
            if path not in routes:
                raise APIError(404, f"Unknown request URL: {method} {path}. This server serves GET /v1/models, "
                                    "POST /v1/completions and POST /v1/chat/completions.", code="unknown_url")
            want, handler = routes[path]
            if method != want:
                raise APIError(405, f"{method} {path}: use {want}")
            handler()
        except APIError as e:
            self._send_json(e.status, e.body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # the server keeps serving
            log.exception("%s %s failed", method, path)
            self._send_json(500, APIError(500, f"internal error: {type(e).__name__}: {e}",
                                          type="server_error").body())

    def _models(self) -> None:
        self._send_json(200, self.frontend.models())

    def _model(self, name: str) -> None:
        if name != self.frontend.name:
            raise APIError(404, f"The model {name!r} does not exist; this server serves {self.frontend.name!r}",
                           param="model", code="model_not_found")
        self._send_json(200, self.frontend.model_card())

    def _health(self) -> None:
        self._send_json(200, {"status": "ok"})

    def _completions(self) -> None:
        self._generate(chat=False)

    def _chat(self) -> None:
        self._generate(chat=True)

    def _generate(self, *, chat: bool) -> None:
        call = self.frontend.parse(self._body(), chat=chat)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        if not call.stream:
            outcome = Outcome()
            for _ in self.frontend.run(call, outcome):
                pass
            self._send_json(200, self.frontend.answer(call, outcome, request_id))
            return
        chunks = self.frontend.chunks(call, request_id)
        try:
            first = next(chunks)  # a refused request is an HTTP error
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream; charset=utf-8")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in _chain(first, chunks):
                    self._event(json.dumps(chunk, ensure_ascii=False))
            except APIError as e:  # mid-stream: an error event, as OpenAI sends one
                self._event(json.dumps(e.body(), ensure_ascii=False))
            self._event("[DONE]")
            self._write_chunk(b"")
        finally:
            chunks.close()  # a client gone mid-stream: the request is cancelled on the server

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            raise APIError(411, "send the request body with a Content-Length")
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            self.close_connection = True
            raise _bad("Content-Length is not a number") from None
        if length > MAX_BODY:
            self.close_connection = True
            raise APIError(413, f"the request body is {length} bytes; at most {MAX_BODY} are taken")
        return self.rfile.read(length) if length > 0 else b""

    def _body(self) -> object:
        if not self._raw:
            raise _bad("the request body is empty; send a JSON object")
        try:
            return json.loads(self._raw)
        except ValueError as e:
            raise _bad(f"the request body is not valid JSON ({e})") from None

    def _send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _event(self, data: str) -> None:
        self._write_chunk(f"data: {data}\n\n".encode())

    def _write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


def _chain(first, rest):
    yield first
    yield from rest


class OpenAIServer:
    """The frontend on a threaded HTTP server: bound on construction (a port in use fails at once), serving from
    `start()` in a background thread until `stop()`. Binds loopback unless told otherwise."""

    def __init__(self, frontend: OpenAIFrontend, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT):
        self.frontend = frontend
        handler = type("Handler", (_Handler,), {"frontend": frontend})
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as e:
            raise ServerError(f"cannot listen on {host}:{port} for the OpenAI API ({e.strerror or e})") from None
        self.httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/v1"

    def start(self, *, wait_s: float = 0.0) -> OpenAIServer:
        """Check the deployment (waiting up to wait_s for it), then serve."""
        self.frontend.check(wait_s=wait_s)
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="trtspec-openai", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def stop(self) -> None:
        """Take no new requests; those in flight end with the deployment's answers."""
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(5)
            self._thread = None
        self.httpd.server_close()
        self.frontend.close()

    def __enter__(self) -> OpenAIServer:
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
