"""An OpenAI-compatible HTTP API in front of a served deployment, over the ensemble's gRPC.

`GET /v1/models`, `POST /v1/completions` and `POST /v1/chat/completions`, each streamed as server-sent events
(`stream: true`) or not, with `usage` and trtspec's acceptance statistics in `usage.trtspec`. Triton's own OpenAI
frontend needs the in-process `tritonserver` bindings (wheels only for Python 3.12 on glibc >= 2.39, and they host
the models themselves); this one is a thin translator to the contract of docs/triton-contract.md on the standard
library's threaded HTTP server, so the serving path gains no dependency. Requests are checked by openai_request.
Stop strings are applied here on the text (the ensemble's stop words are token sequences and stay in the reply):
the text ends before the first one, held back while it may still become one, and the request is cancelled.
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
from trtspec.triton.client import MODEL, RemoteGeneration, TritonClient
from trtspec.triton.openai_request import APIError, Call, Target, bad_request, parse_request

log = logging.getLogger(__name__)

DEFAULT_PORT = 9000  # as Triton's own OpenAI frontend
MAX_BODY = 16 << 20
IDLE_CLIENTS = 16  # gRPC connections kept for the next requests
# the engine's finish reason → OpenAI's ("abort": the server ended the request, e.g. its drain time was over)
FINISH = {"length": "length", "end_id": "stop", "stop_word": "stop", "cancelled": "abort"}


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
        return cls(url, tokenizer=_tokenizer(tokenizer_dir), max_seq_len=max_seq_len, **kwargs)

    @classmethod
    def with_tokenizer(cls, url: str, path: Path | None, **kwargs) -> OpenAIFrontend:
        """A frontend for the deployment at `url`, with the tokenizer of `path`: a tokenizer folder, or a model
        repository (its preprocessing's, and its engine's max_seq_len); None: without one."""
        if path is None or (Path(path) / "tokenizer.json").is_file():
            return cls(url, tokenizer=_tokenizer(path), **kwargs)
        frontend = cls.for_repository(path, url, **kwargs)
        if frontend.tokenizer is None:
            raise ConfigError(f"--tokenizer {path}: no tokenizer.json there, and not a model repository with one")
        return frontend

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
        target = Target(self.name, self.tokenizer, self.inputs is None or "apply_chat_template" in self.inputs,
                        self.max_seq_len)
        return parse_request(body, target, chat=chat)

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

    def logprobs(self, call: Call, outcome: Outcome) -> dict:
        """OpenAI's logprobs of the reply's tokens: those whose text is in the reply (a stop string cuts the rest,
        the end token has none), each named by the tokenizer; chat's `content` list, or completions' token lists."""
        r = outcome.record
        if not r.output_ids or r.log_probs is None:
            raise APIError(502, "the deployment returned no output_ids / output_log_probs for logprobs (trtspec's "
                                "CPU flavour returns both)", type="server_error")
        ids = list(r.output_ids)[:len(r.log_probs)]
        if r.finish_reason == "end_id" and ids:
            ids.pop()  # the end token: no text of its own
        if len(self.tokenizer.decode(ids)) > len(outcome.text):  # a stop string cut the reply: the tokens before it
            n = 0
            while n < len(ids) and len(self.tokenizer.decode(ids[:n + 1])) <= len(outcome.text):
                n += 1
            ids = ids[:n]
        tokens = [self.tokenizer.decode([token]) for token in ids]
        values = [round(float(v), 6) for v in r.log_probs[:len(ids)]]
        if call.chat:
            return {"content": [{"token": t, "logprob": v, "bytes": list(t.encode()), "top_logprobs": []}
                                for t, v in zip(tokens, values)], "refusal": None}
        offsets = [len(call.echo) + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": [{t: v} for t, v in zip(tokens, values)],
                "text_offset": offsets}

    def answer(self, call: Call, outcome: Outcome, request_id: str) -> dict:
        """The non-streamed reply."""
        text = call.echo + outcome.text
        head = {"id": request_id, "created": int(time.time()), "model": self.name, "system_fingerprint": None}
        logprobs = self.logprobs(call, outcome) if call.logprobs else None
        if call.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs,
                      "finish_reason": outcome.finish_reason}
            return {**head, "object": "chat.completion", "choices": [choice], "usage": self.usage(call, outcome)}
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": outcome.finish_reason}
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


def _tokenizer(path: Path | None):
    if path is None:
        return None
    from trtspec.runtime.tokenizer import Tokenizer

    return Tokenizer.from_dir(path)


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
            raise bad_request("Content-Length is not a number") from None
        if length > MAX_BODY:
            self.close_connection = True
            raise APIError(413, f"the request body is {length} bytes; at most {MAX_BODY} are taken")
        return self.rfile.read(length) if length > 0 else b""

    def _body(self) -> object:
        if not self._raw:
            raise bad_request("the request body is empty; send a JSON object")
        try:
            return json.loads(self._raw)
        except ValueError as e:
            raise bad_request(f"the request body is not valid JSON ({e})") from None

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

    @classmethod
    def beside(cls, server, repo: Path, *, port: int, served_model_name: str | None = None) -> OpenAIServer:
        """The API for the repository a TritonServer (not started yet) serves, bound on its address; its gRPC
        endpoint reached on loopback when it listens on every interface."""
        address, grpc_port = server.options.address, server.options.grpc_port
        local = "127.0.0.1" if address in ("0.0.0.0", "", "::") else address
        frontend = OpenAIFrontend.for_repository(repo, f"{local}:{grpc_port}", served_model_name=served_model_name)
        return cls(frontend, host=address, port=port)

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

    def serve_forever(self, *, wait_s: float = 0.0, on_ready=None) -> None:
        """Check the deployment (waiting up to wait_s for it), call on_ready(), then serve in this thread until
        interrupted."""
        try:
            self.frontend.check(wait_s=wait_s)
            if on_ready is not None:
                on_ready()
            self.httpd.serve_forever()
        finally:
            self.stop()

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
