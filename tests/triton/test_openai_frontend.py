"""The OpenAI-compatible frontend: the real HTTP server on a free loopback port.

Fast tests put a small in-process stand-in for tritonclient's gRPC connection behind it (request parsing, SSE
framing, error shapes, stop strings, cancellation); the slow ones run the real `openai` client against the real
tritonserver serving the tiny deployment, and compare with in-process generation.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException, deserialize_bytes_tensor, triton_to_np_dtype

from trtspec.cli import cli
from trtspec.triton.contract import cpu_ensemble_inputs
from trtspec.triton.openai_frontend import OpenAIFrontend, OpenAIServer, StopScanner
from trtspec.triton.server import free_port

REPLY = "The sky is blue. The grass is green. Stop here, then more words follow until the end of the reply."


class FakeEngine:
    """What the fake gRPC connections answer: REPLY word by word (one response per word when streamed), the
    trtspec CPU flavour's counters, every request's inputs recorded. A prompt with "refuse" gets an in-band error
    (as a model's refusal), with "unavailable" a transport error, with "midway" an error after two words."""

    def __init__(self, *, delay: float = 0.0, reply: str = REPLY, input_tokens: bool = True):
        self.delay, self.reply, self.input_tokens = delay, reply, input_tokens
        self.requests: list[dict] = []
        self.cancelled = 0
        self.sent_words: list[int] = []  # per request: words sent before it ended

    def connect(self):
        return FakeConnection(self)


class FakeResult:
    def __init__(self, request_id: str, outputs: dict, final: bool):
        self._outputs = outputs
        self._response = SimpleNamespace(id=request_id, outputs=list(outputs),
                                         parameters={"triton_final_response": SimpleNamespace(bool_param=final)})

    def get_response(self):
        return self._response

    def as_numpy(self, name):
        return self._outputs.get(name)


def _value(t):
    content = t._get_content()
    if t.datatype() == "BYTES":
        return deserialize_bytes_tensor(content).reshape(-1)[0].decode()
    return np.frombuffer(content, triton_to_np_dtype(t.datatype())).reshape(-1)[0].item()


class FakeConnection:
    """Stands in for tritonclient.grpc.InferenceServerClient (the calls TritonClient makes)."""

    def __init__(self, engine: FakeEngine):
        self.engine, self.callback, self.stopped = engine, None, threading.Event()

    def get_model_metadata(self, model):
        return SimpleNamespace(inputs=[SimpleNamespace(name=t.name) for t in cpu_ensemble_inputs()])

    def is_model_ready(self, model):
        return True

    def start_stream(self, callback):
        self.callback, self.stopped = callback, threading.Event()

    def stop_stream(self, cancel_requests=False):
        if cancel_requests:
            self.engine.cancelled += 1
        self.stopped.set()

    def close(self):
        self.stopped.set()

    def async_stream_infer(self, model, inputs, request_id="", enable_empty_final_response=False):
        values = {t.name(): _value(t) for t in inputs}
        self.engine.requests.append(values)
        threading.Thread(target=self._answer, args=(values, request_id, self.callback, self.stopped),
                         daemon=True).start()

    def _answer(self, values: dict, request_id: str, callback, stopped: threading.Event) -> None:
        prompt, engine = values["text_input"], self.engine
        if "refuse" in prompt:
            return callback(None, InferenceServerException("in ensemble 'ensemble', the prompt has 900 tokens; the "
                                                           "engine's max_input_len is 64"))
        if "unavailable" in prompt:
            return callback(None, InferenceServerException("failed to connect", status="StatusCode.UNAVAILABLE"))
        words = re.findall(r"\S+\s*", engine.reply)[:values["max_tokens"]]
        finish = "length" if values["max_tokens"] <= len(re.findall(r"\S+\s*", engine.reply)) else "end_id"
        chunks = [[w] for w in words] if values["stream"] else [words]
        sent = 0
        for i, chunk in enumerate(chunks):
            if stopped.wait(engine.delay) if engine.delay else stopped.is_set():
                break
            if "midway" in prompt and sent == 2:
                engine.sent_words.append(sent)
                return callback(None, InferenceServerException("engine step failed: boom",
                                                               status="StatusCode.INTERNAL"))
            sent += len(chunk)
            last = i == len(chunks) - 1
            outputs = {"text_output": np.array(["".join(chunk).encode()], np.object_),
                       "output_ids": np.arange(sent - len(chunk), sent, dtype=np.int32).reshape(1, 1, -1),
                       "num_verify_steps": np.array([[(sent + 1) // 2]], np.int32),
                       "num_draft_tokens": np.array([[2 * ((sent + 1) // 2)]], np.int32),
                       "num_accepted_tokens": np.array([[sent - (sent + 1) // 2]], np.int32),
                       "finish_reason": np.array([[finish.encode() if last else b""]], np.object_)}
            if engine.input_tokens:
                outputs["num_input_tokens"] = np.array([[len(prompt.split())]], np.int32)
            callback(FakeResult(request_id, outputs, final=last), None)
        engine.sent_words.append(sent)


@pytest.fixture
def engine():
    return FakeEngine()


def _start(engine: FakeEngine, **kwargs) -> OpenAIServer:
    frontend = OpenAIFrontend("fake:1", connect=engine.connect, **kwargs)
    return OpenAIServer(frontend, port=free_port()).start()


@pytest.fixture
def api(engine):
    with _start(engine) as server:
        yield server


def _connection(server: OpenAIServer) -> http.client.HTTPConnection:
    host, port = server.httpd.server_address[:2]
    return http.client.HTTPConnection(host, port, timeout=30)


def _request(server, method: str, path: str, body=None, *, connection=None):
    """(status, headers, raw body) of one request."""
    conn = connection or _connection(server)
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


def _post(server, path: str, body, **kwargs):
    status, headers, raw = _request(server, "POST", path, body, **kwargs)
    return status, headers, raw


def _json(server, path: str, body, **kwargs):
    status, _, raw = _post(server, path, body, **kwargs)
    return status, json.loads(raw)


def _events(raw: bytes) -> list[str]:
    """The SSE data fields of a stream, checking the framing: only `data: ...` events, each ended by a blank line."""
    text = raw.decode()
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    events = text.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e.removeprefix("data: ") for e in events]


def _assert_error(body: dict, *, param=None, code=None, message=None):
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"]
    assert body["error"]["param"] == param and body["error"]["code"] == code, body
    if message:
        assert re.search(message, body["error"]["message"]), body


# ---- models, completions, chat ---------------------------------------------------------------------------------------


def test_models_lists_the_served_model(engine):
    with _start(engine, served_model_name="tiny") as server:
        status, _, raw = _request(server, "GET", "/v1/models")
        assert status == 200
        body = json.loads(raw)
        assert body["object"] == "list" and [m["id"] for m in body["data"]] == ["tiny"]
        assert body["data"][0]["object"] == "model" and body["data"][0]["owned_by"] == "trtspec"
        assert json.loads(_request(server, "GET", "/v1/models/tiny")[2])["id"] == "tiny"
        status, _, raw = _request(server, "GET", "/v1/models/other")
        assert status == 404
        _assert_error(json.loads(raw), param="model", code="model_not_found")
        assert server.url == f"http://127.0.0.1:{server.httpd.server_address[1]}/v1"


def test_a_completion_maps_openai_fields_onto_the_ensemble(api, engine):
    status, body = _json(api, "/v1/completions", {"model": "ensemble", "prompt": "Say something", "max_tokens": 5,
                                                  "seed": 7, "top_k": 3, "user": "ignored"})
    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == "ensemble"
    (choice,) = body["choices"]
    assert choice["text"] == "The sky is blue. The " and choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {"prompt_tokens": 2, "completion_tokens": 5, "total_tokens": 7,
                             "trtspec": {"steps": 3, "draft_tokens": 6, "accepted_tokens": 2,
                                         "acceptance_rate": 0.3333, "acceptance_length": 1.6667}}
    sent = engine.requests[-1]
    # OpenAI's defaults (temperature 1, top_p 1) spelled out: sampling, not TensorRT-LLM's greedy default
    assert sent["text_input"] == "Say something" and sent["max_tokens"] == 5 and sent["stream"] is True
    assert sent["temperature"] == 1.0 and sent["top_p"] == 1.0 and sent["top_k"] == 3 and sent["random_seed"] == 7
    assert sent["apply_chat_template"] is False and sent["exclude_input_in_output"] is True
    _json(api, "/v1/completions", {"model": "ensemble", "prompt": ["Again"], "temperature": 0})
    sent = engine.requests[-1]
    assert sent["max_tokens"] == 16 and sent["temperature"] == 0.0 and "random_seed" not in sent  # OpenAI's default


def test_echo_and_the_end_of_a_reply(api):
    body = _json(api, "/v1/completions", {"model": "ensemble", "prompt": "Q: ", "max_tokens": 100, "echo": True})[1]
    assert body["choices"][0]["text"] == "Q: " + REPLY and body["choices"][0]["finish_reason"] == "stop"


def test_a_chat_is_rendered_with_the_models_template(engine, tmp_path):
    """With the tokenizer the frontend renders the chat and sends the text the deployment's preprocessing (which
    adds the BOS itself) turns into the rendered chat's ids; without it, one user message goes to the
    deployment's own template."""
    from trtspec.runtime.tokenizer import Tokenizer
    from trtspec.testing.tokenizers import write_tiny_tokenizer

    write_tiny_tokenizer(tmp_path)
    tokenizer = Tokenizer.from_dir(tmp_path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text",
                                                                                       "text": "Hello world"}]}]
    counting = FakeEngine(input_tokens=False)  # a deployment that does not count the prompt (the GPU flavour)
    with _start(counting, tokenizer=tokenizer, max_seq_len=100) as server:
        status, body = _json(server, "/v1/chat/completions", {"model": "ensemble", "messages": messages})
        assert status == 200 and body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
        (choice,) = body["choices"]
        assert choice["message"] == {"role": "assistant", "content": REPLY} and choice["finish_reason"] == "stop"
        engine_seen = counting.requests[-1]
        rendered = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world"}]
        ids = tokenizer.encode_chat(rendered)
        assert engine_seen["apply_chat_template"] is False
        assert tokenizer.encode(engine_seen["text_input"], add_special_tokens=True) == ids
        assert not engine_seen["text_input"].startswith("<s>")  # the BOS the template writes, left to preprocessing
        assert body["usage"]["prompt_tokens"] == len(ids)  # counted here: this deployment does not say
        assert engine_seen["max_tokens"] == 100 - len(ids)  # no max_tokens: the engine's room
    with _start(engine) as server:
        body = _json(server, "/v1/chat/completions", {"model": "ensemble", "max_tokens": 3,
                                                      "messages": [{"role": "user", "content": "Hi there"}]})[1]
        assert body["choices"][0]["message"]["content"] == "The sky is "
        assert engine.requests[-1]["text_input"] == "Hi there" and engine.requests[-1]["apply_chat_template"] is True
        status, body = _json(server, "/v1/chat/completions", {"model": "ensemble", "messages": messages})
        assert status == 400
        _assert_error(body, param="messages", message="one user message only.*--tokenizer")


# ---- streaming -------------------------------------------------------------------------------------------------------


def test_streams_are_server_sent_events_that_add_up_to_the_reply(api):
    body = {"model": "ensemble", "prompt": "Say something", "max_tokens": 12, "temperature": 0}
    whole = _json(api, "/v1/completions", body)[1]["choices"][0]["text"]
    status, headers, raw = _post(api, "/v1/completions", {**body, "stream": True,
                                                          "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    assert headers["Transfer-Encoding"] == "chunked"
    events = [json.loads(e) for e in _events(raw)[:-1]]
    assert all(e["object"] == "text_completion" and e["id"] == events[0]["id"] for e in events)
    texts = [e["choices"][0]["text"] for e in events if e["choices"]]
    assert "".join(texts) == whole and len(texts) > 3  # one event per streamed response
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 12
    assert events[-1]["usage"]["trtspec"]["steps"] == 6
    status, _, raw = _post(api, "/v1/completions", {**body, "stream": True})
    assert "usage" not in json.loads(_events(raw)[-2])  # only asked for


def test_a_chat_stream_starts_with_the_role_and_ends_with_the_reason(api):
    status, _, raw = _post(api, "/v1/chat/completions", {"model": "ensemble", "stream": True, "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "Hi"}]})
    events = [json.loads(e) for e in _events(raw)[:-1]]
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""} and deltas[-1] == {}
    assert "".join(d.get("content", "") for d in deltas) == "The sky is blue. "
    assert events[-1]["choices"][0]["finish_reason"] == "length"


# ---- stop strings ----------------------------------------------------------------------------------------------------


def test_stop_scanner_holds_back_what_may_become_a_stop_string():
    scanner = StopScanner(("STOP", "\n\n"))
    assert [scanner.feed(p) for p in ("ab", "cS", "T", "x", "\n")] == ["ab", "c", "", "STx", ""]
    assert scanner.feed("\nrest") == "" and scanner.hit  # "STx" was no stop string; the held "\n" began one
    scanner = StopScanner(("end",))
    assert scanner.feed("the en") == "the " and scanner.flush() == "en"
    assert StopScanner(()).feed("anything") == "anything"
    scanner = StopScanner(("b", "abc"))
    assert scanner.feed("xab") == "xa" and scanner.hit  # the earliest stop string wins


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_text_before_it_and_cancels_the_request(stream):
    engine = FakeEngine(delay=0.02, reply=REPLY * 20)
    with _start(engine) as server:
        body = {"model": "ensemble", "prompt": "Go", "max_tokens": 400, "stop": ["zzz", "here,"], "stream": stream}
        status, _, raw = _post(server, "/v1/completions", body)
        assert status == 200
        if stream:
            events = [json.loads(e) for e in _events(raw)[:-1]]
            text = "".join(e["choices"][0]["text"] for e in events)
            finish = events[-1]["choices"][0]["finish_reason"]
        else:
            choice = json.loads(raw)["choices"][0]
            text, finish = choice["text"], choice["finish_reason"]
        assert text == "The sky is blue. The grass is green. Stop " and finish == "stop"
        assert engine.requests[-1]["stop_words"] in ("zzz", "here,")  # sent on too, where token-aligned it saves steps
        deadline = time.monotonic() + 5
        while not engine.sent_words and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.cancelled == 1 and engine.sent_words[-1] < 20  # not the 400 words asked for


# ---- errors ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, status, param, code, message", [
    ({"model": "ensemble", "prompt": "x", "n": 2}, 400, "n", None, "n = 2: one choice per request"),
    ({"model": "gpt-4", "prompt": "x"}, 404, "model", "model_not_found", "'gpt-4' does not exist.*serves 'ensemble'"),
    ({"prompt": "x"}, 400, "model", None, "provide a model"),
    ({"model": "ensemble", "prompt": ""}, 400, "prompt", None, "non-empty"),
    ({"model": "ensemble", "prompt": [1, 2, 3]}, 400, "prompt", None, "not token ids"),
    ({"model": "ensemble", "prompt": "x", "temperature": -1}, 400, "temperature", None, "out of range"),
    ({"model": "ensemble", "prompt": "x", "top_p": "high"}, 400, "top_p", None, "must be a number"),
    ({"model": "ensemble", "prompt": "x", "max_tokens": 0}, 400, "max_tokens", None, "out of range"),
    ({"model": "ensemble", "prompt": "x", "logprobs": 2}, 400, "logprobs", None, "chosen token's log probability only"),
    ({"model": "ensemble", "prompt": "x", "logprobs": 0, "stream": True}, 400, "logprobs", None, "stream false"),
    ({"model": "ensemble", "prompt": "x", "presence_penalty": 3}, 400, "presence_penalty", None, "out of range"),
    ({"model": "ensemble", "prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty", None, "must be > 0"),
    ({"model": "ensemble", "prompt": "x", "stop": 3}, 400, "stop", None, "string or a list"),
    ({"model": "ensemble", "prompt": "x", "stream": "yes"}, 400, "stream", None, "true or false"),
    ({"model": "ensemble", "prompt": "please refuse"}, 400, None, None, "max_input_len is 64"),
    ({"model": "ensemble", "prompt": "unavailable", "stream": True}, 503, None, "unavailable", "unavailable"),
    ([1, 2], 400, None, None, "JSON object"),
])
def test_errors_are_openai_shaped_and_the_server_keeps_serving(api, body, status, param, code, message):
    conn = _connection(api)
    got, headers, raw = _post(api, "/v1/completions", body, connection=conn)
    assert got == status and headers["Content-Type"] == "application/json"
    _assert_error(json.loads(raw), param=param, code=code, message=message)
    # the same connection (keep-alive) answers the next request
    ok, _ = _json(api, "/v1/completions", {"model": "ensemble", "prompt": "x", "max_tokens": 2}, connection=conn)
    assert ok == 200


def test_chat_errors(api):
    for messages, message in (([], "non-empty list"), ([{"role": "tool", "content": "x"}], "not tool calls"),
                              ([{"role": "user", "content": [{"type": "image_url"}]}], "only text parts")):
        status, body = _json(api, "/v1/chat/completions", {"model": "ensemble", "messages": messages})
        assert status == 400
        _assert_error(body, param="messages", message=message)
    status, body = _json(api, "/v1/chat/completions", {"model": "ensemble", "n": 3,
                                                       "messages": [{"role": "user", "content": "x"}]})
    assert status == 400 and body["error"]["param"] == "n"


def test_unknown_urls_methods_and_bodies(api):
    status, _, raw = _request(api, "GET", "/v1/engines")
    assert status == 404
    _assert_error(json.loads(raw), code="unknown_url", message="Unknown request URL: GET /v1/engines")
    status, _, raw = _request(api, "GET", "/v1/completions")
    assert status == 405 and "use POST" in json.loads(raw)["error"]["message"]
    status, _, raw = _post(api, "/v1/completions", b"{not json")
    assert status == 400 and "not valid JSON" in json.loads(raw)["error"]["message"]
    status, _, raw = _post(api, "/v1/completions", b"")
    assert status == 400 and "empty" in json.loads(raw)["error"]["message"]
    assert _request(api, "GET", "/health")[0] == 200


def test_an_error_mid_stream_is_an_error_event():
    with _start(FakeEngine(delay=0.01)) as server:
        status, _, raw = _post(server, "/v1/completions", {"model": "ensemble", "prompt": "midway", "max_tokens": 10,
                                                           "stream": True})
        assert status == 200
        events = _events(raw)
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
        assert "".join(texts) == "The sky "
        _assert_error(json.loads(events[-2]), code="upstream_error", message="engine step failed: boom")
        assert _json(server, "/v1/completions", {"model": "ensemble", "prompt": "x", "max_tokens": 2})[0] == 200


def test_a_client_gone_mid_stream_cancels_its_request():
    engine = FakeEngine(delay=0.02, reply=REPLY * 20)
    with _start(engine) as server:
        conn = _connection(server)
        conn.request("POST", "/v1/completions", body=json.dumps({"model": "ensemble", "prompt": "Go",
                                                                 "max_tokens": 400, "stream": True}).encode())
        response = conn.getresponse()
        assert response.status == 200 and response.read1(64)
        conn.sock.close()  # gone, as a client that stops reading
        conn.close()
        deadline = time.monotonic() + 10
        while not (engine.cancelled and engine.sent_words) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert engine.cancelled == 1 and engine.sent_words and engine.sent_words[-1] < 100
        assert _json(server, "/v1/completions", {"model": "ensemble", "prompt": "x", "max_tokens": 2})[0] == 200


def test_requests_run_concurrently(engine):
    engine.delay = 0.05
    with _start(engine) as server:
        results = [None] * 4

        def one(i):
            results[i] = _json(server, "/v1/completions", {"model": "ensemble", "prompt": f"p{i}", "max_tokens": 6})

        start = time.monotonic()
        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r[0] == 200 and r[1]["choices"][0]["text"] == "The sky is blue. The grass " for r in results)
        assert time.monotonic() - start < 4 * 6 * 0.05  # not one after the other


# ---- the commands ----------------------------------------------------------------------------------------------------


def test_openai_command_says_when_no_server_answers(tmp_path):
    result = CliRunner().invoke(cli, ["openai", "--url", f"127.0.0.1:{free_port()}", "--port", str(free_port())])
    assert result.exit_code == 1 and "cannot reach a Triton server" in result.output
    assert "OpenAI-compatible API at" not in result.output  # said once it answers
    result = CliRunner().invoke(cli, ["openai", "--url", "127.0.0.1:1", "--tokenizer", str(tmp_path)])
    assert result.exit_code == 1
    assert f"--tokenizer {tmp_path}: no tokenizer.json there, and not a model repository with one" in result.output


def test_serve_takes_a_model_name_only_with_the_openai_port(tmp_path):
    result = CliRunner().invoke(cli, ["serve", str(tmp_path), "--served-model-name", "x"])
    assert result.exit_code == 2 and "pass --openai-port too" in result.output


def test_a_port_in_use_is_one_line(engine):
    import socket

    from trtspec.errors import ServerError

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(ServerError, match=r"cannot listen on 127.0.0.1:\d+ for the OpenAI API"):
            OpenAIServer(OpenAIFrontend("x:1", connect=engine.connect), port=held.getsockname()[1])


# ---- the real server and the real openai client ----------------------------------------------------------------------

PROMPT = "Hello world speculative decoding"


@pytest.fixture(scope="module")
def openai_api(server, tiny_repo):
    frontend = OpenAIFrontend.for_repository(tiny_repo, server.grpc_url)
    with OpenAIServer(frontend, port=free_port()) as running:
        yield running


@pytest.fixture(scope="module")
def local(tiny_engine):
    from trtspec.runtime.generator import LocalGenerator

    return LocalGenerator(tiny_engine, threads=1, backoff=False)  # whole trees, as tiny_repo deploys them


def _client(api):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=api.url, api_key="unused", max_retries=0)


@pytest.mark.slow
def test_openai_client_against_the_real_server(openai_api, local, tiny_engine, tiny_repo):
    """The real openai client: the model list; a greedy chat equals `trtspec generate`'s in-process reply to the same
    prompt, a greedy completion in-process generation of the raw prompt's ids, streamed or not; usage and the
    acceptance statistics as in process; a stop string; a bad model name and n = 2 as OpenAI's errors, the server
    answering on."""
    import openai

    from trtspec.speculative.loop import GenerationConfig

    client = _client(openai_api)
    assert [m.id for m in client.models.list()] == ["ensemble"]

    # chat: the prompt through the chat template, as `trtspec generate --prompt` renders it
    generated = CliRunner().invoke(cli, ["generate", str(tiny_engine), "--prompt", PROMPT, "--max-tokens", "24",
                                         "--json", "--no-backoff", "--threads", "1"])
    assert generated.exit_code == 0, generated.output
    expected = json.loads(generated.stdout.strip().splitlines()[-1])
    messages = [{"role": "user", "content": PROMPT}]
    chat = client.chat.completions.create(model="ensemble", messages=messages, max_tokens=24, temperature=0)
    assert chat.choices[0].message.content == expected["text"] and chat.choices[0].message.role == "assistant"
    assert chat.usage.completion_tokens == len(expected["output_ids"])
    stats = chat.usage.trtspec
    for key in ("steps", "draft_tokens", "accepted_tokens", "acceptance_length"):
        assert stats[key] == expected["stats"][key], key
    assert stats["draft_tokens"] > 0
    pieces = client.chat.completions.create(model="ensemble", messages=messages, max_tokens=24, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(pieces)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected["text"]
    assert chunks[-1].usage.completion_tokens == len(expected["output_ids"])
    assert chunks[-1].usage.trtspec["steps"] == expected["stats"]["steps"]

    # completion: the raw prompt (no template), as its ids with the tokenizer's special tokens
    ids = local.tokenizer.encode(PROMPT, add_special_tokens=True)
    want = local.generate(ids, GenerationConfig(max_tokens=20))
    done = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=20, temperature=0)
    assert done.choices[0].text == want.text and done.choices[0].finish_reason in ("length", "stop")
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (len(ids), len(want.output_ids))
    assert done.usage.total_tokens == len(ids) + len(want.output_ids)
    assert done.usage.trtspec["steps"] == want.result.stats.steps
    streamed = list(client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=20, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed) == want.text and len(streamed) > 2

    # a multi-turn chat: rendered here, the ids the server counts are the template's
    turns = [{"role": "system", "content": "Medusa heads"}, {"role": "user", "content": "quick brown fox"},
             {"role": "assistant", "content": "the target model"}, {"role": "user", "content": "tokens"}]
    reply = client.chat.completions.create(model="ensemble", messages=turns, max_tokens=12, temperature=0)
    assert reply.usage.prompt_tokens == len(local.tokenizer.encode_chat(turns))
    assert reply.choices[0].message.content == local.generate(turns, GenerationConfig(max_tokens=12)).text

    # a stop string: the text before it, finish reason stop
    cut = next(i for i in range(3, len(want.text)) if want.text[i] not in " \ufffd")
    stop = want.text[cut:cut + 2]
    stopped = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=20, temperature=0, stop=[stop])
    assert stopped.choices[0].text == want.text[:want.text.index(stop)]
    assert stopped.choices[0].finish_reason == "stop"

    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
    assert missing.value.code == "model_not_found" and "serves 'ensemble'" in missing.value.message
    with pytest.raises(openai.BadRequestError) as several:
        client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=4, n=2)
    assert several.value.param == "n"
    with pytest.raises(openai.BadRequestError, match="max_seq_len"):  # refused by the engine, said by the server
        client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=1000)
    again = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=20, temperature=0)
    assert again.choices[0].text == want.text


@pytest.mark.slow
def test_logprobs_and_penalties_through_the_openai_client(openai_api, local):
    """Chat `logprobs: true` and completions `logprobs: 0`: each reply token's log probability as in-process
    generation computes it, named by the tokenizer; penalties give in-process generation's tokens with the same
    penalties."""
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.penalties import Penalties

    client = _client(openai_api)
    ids = local.tokenizer.encode(PROMPT, add_special_tokens=True)
    want = local.generate(ids, GenerationConfig(max_tokens=12, return_log_probs=True))
    done = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=0)
    lp = done.choices[0].logprobs
    kept = want.output_ids[:-1] if want.result.finish_reason == "end_id" else want.output_ids
    assert lp.tokens == [local.tokenizer.decode([t]) for t in kept]
    np.testing.assert_allclose(lp.token_logprobs, want.result.log_probs[:len(kept)], rtol=1e-4, atol=1e-5)
    assert lp.text_offset[0] == 0 and all(v <= 0 for v in lp.token_logprobs)
    chat = client.chat.completions.create(model="ensemble", messages=[{"role": "user", "content": PROMPT}],
                                          max_tokens=12, temperature=0, logprobs=True)
    content = chat.choices[0].logprobs.content
    assert content and all(c.logprob <= 0 and c.top_logprobs == [] for c in content)
    assert "".join(c.token for c in content) == chat.choices[0].message.content

    penalties = Penalties(repetition=1.3, presence=0.5, frequency=0.5)
    penalized = local.generate(ids, GenerationConfig(max_tokens=20, penalties=penalties))
    got = client.completions.create(model="ensemble", prompt=PROMPT, max_tokens=20, temperature=0,
                                    presence_penalty=0.5, frequency_penalty=0.5,
                                    extra_body={"repetition_penalty": 1.3})
    assert got.choices[0].text == penalized.text != local.generate(ids, GenerationConfig(max_tokens=20)).text


@pytest.mark.slow
def test_the_serving_docs_openai_example_runs(openai_api, local, capsys):
    """docs/serving.md's openai example (the openai package only) prints the greedy chat reply."""
    from pathlib import Path

    from trtspec.speculative.loop import GenerationConfig

    pytest.importorskip("openai")
    page = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```python\n")[1:]]
    (example,) = [b for b in blocks if "from openai import OpenAI" in b]
    assert "import trtspec" not in example and "from trtspec" not in example and "127.0.0.1:9000/v1" in example
    exec(compile(example.replace("http://127.0.0.1:9000/v1", openai_api.url), "docs/serving.md", "exec"), {})
    printed = capsys.readouterr().out
    expected = local.generate("Explain speculative decoding in one sentence.", GenerationConfig(max_tokens=64))
    assert printed.startswith(expected.text + "\n")
    stats = printed.removeprefix(expected.text + "\n")
    assert stats.startswith("{'steps': ") and "'acceptance_length': " in stats


@pytest.mark.slow
def test_serve_with_an_openai_port(tiny_repo):
    """`trtspec serve REPO --openai-port N`: the API's URL printed before the usual banner, answering; SIGTERM
    stops both, exit 0."""
    import signal
    import subprocess
    import sys
    import urllib.request

    port = free_port()
    argv = [sys.executable, "-m", "trtspec.cli", "serve", str(tiny_repo), "--grpc-port", str(free_port()),
            "--http-port", str(free_port()), "--metrics-port", str(free_port()), "--openai-port", str(port),
            "--served-model-name", "tiny"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        for line in process.stderr:
            lines.append(line)
            if line.startswith("serving "):
                break
        assert f"OpenAI-compatible API at http://127.0.0.1:{port}/v1 (model 'tiny')\n" in lines, lines[-5:]
        threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/v1/models", timeout=10) as answer:
            assert [m["id"] for m in json.load(answer)["data"]] == ["tiny"]
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", method="POST",
                                         data=json.dumps({"model": "tiny", "prompt": PROMPT, "max_tokens": 4,
                                                          "temperature": 0}).encode())
        with opener.open(request, timeout=60) as answer:
            assert json.load(answer)["usage"]["completion_tokens"] >= 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0
        assert process.stdout.read() == ""
    finally:
        if process.poll() is None:
            process.kill()
