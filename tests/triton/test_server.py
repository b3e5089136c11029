"""The real tritonserver (bundled in nvidia-pytriton) serving the CPU-flavour repository over real gRPC.

Concurrency (16 streams, mixed lengths, mixed speculation on / off) equals in-process generation token for
token; bad requests get an error for that request only; a client that disconnects mid-stream costs nobody else.
"""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.bench.metrics import read_counters
from trtspec.errors import ServerError
from trtspec.testing.grpc_requests import grpc_tensor, stream_once
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.sampling import SamplingParams
from trtspec.triton.client import TritonClient, build_inputs, generate_concurrently
from trtspec.triton.server import CPU_HOST_NOISE, ServerOptions, TritonServer, find_tritonserver, free_port

WORDS = ["Hello world", "speculative decoding", "Medusa heads", "the target model", "tokens", "café 東京 🙂",
         "def f(x): return x", "quick brown fox"]


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, int(rng.integers(1, 4)))) for _ in range(n)]


@pytest.fixture(scope="module")
def local(tiny_engine):
    # whole trees, as tiny_repo deploys them: with back-off, how much a request drafts follows the drafter's measured
    # time, and the steps and drafts compared with the server's would not match
    return LocalGenerator(tiny_engine, threads=1, backoff=False)


@pytest.fixture(scope="module")
def long_server(long_repo):
    """The long-answer repository served: a 1,500-token request runs for some 1,500 of its slow steps unless it is
    ended, so a cancellation or a stop request sent after its first response finds it in flight however loaded the
    machine (the tiny engine's whole answer can be done before a cancellation gets through a loaded machine)."""
    options = ServerOptions(repository=long_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as running:
        yield running


def test_streaming_matches_local_generate(server, local):
    prompts = _prompts(6, seed=1)
    with TritonClient(server.grpc_url) as client:
        for i, prompt in enumerate(prompts):
            pieces = []
            remote = client.generate(prompt, GenerationConfig(max_tokens=40), index=i, on_text=pieces.append)
            expected = local.generate(prompt, GenerationConfig(max_tokens=40), index=i)
            assert remote.output_ids == expected.output_ids
            assert remote.text == "".join(pieces) == expected.text
            assert remote.responses > 1  # streamed, several tokens per response where drafts were accepted
            stats, want = remote.to_dict()["stats"], expected.to_dict()["stats"]
            for key in ("steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "acceptance_length",
                        "steps_per_profile"):
                assert stats[key] == want[key], key
            assert remote.finish_reason == expected.result.finish_reason


def test_sixteen_streams_mixed_lengths_and_speculation(server, local, tiny_repo):
    """16 concurrent streams x 3 requests: every response equals in-process greedy output for its prompt."""
    prompts = _prompts(48, seed=2)
    lengths = [8 + (i * 7) % 60 for i in range(48)]
    option = lambda i: GenerationConfig(max_tokens=lengths[i], no_spec=i % 3 == 0)  # noqa: E731
    before = read_counters(server.metrics_url, publish_via=server.grpc_url)
    results = generate_concurrently(server.grpc_url, prompts, concurrency=16, options_for=option)
    after = read_counters(server.metrics_url, publish_via=server.grpc_url)
    for i, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        expected = local.generate(prompts[i], GenerationConfig(max_tokens=lengths[i]))
        assert result.output_ids == expected.output_ids, i
        assert result.text == expected.text
        assert (result.draft_tokens == 0) == (i % 3 == 0)
    steps = after["trtspec_engine_steps_total"] - before["trtspec_engine_steps_total"]
    sequences = after["trtspec_engine_step_sequences_total"] - before["trtspec_engine_step_sequences_total"]
    # the engine batched requests from different streams into shared verify steps (each request is one sequence).
    # How many share a step depends on when the clients' requests arrive, i.e. on the machine's load, so only that
    # it happened is asserted; test_serving.py's test_jobs_queued_together_share_every_step counts it with
    # controlled arrival.
    assert sequences > steps > 0
    assert sequences <= 8 * steps  # never more sequences in a step than the engine's batch rows
    profile = "trtspec_engine_profile_steps_total"
    assert after[profile] - before[profile] == steps  # every step is counted under the slot profile it ran over
    assert {k for k in after if k.startswith(f"{profile}[")} == {f"{profile}[{s}]" for s in (1, 2, 3, 5, 9)}
    assert after[f"{profile}[9]"] > before.get(f"{profile}[9]", 0)  # the 8-node Medusa tree runs in 9 slots
    drafted = after["trtspec_draft_tokens_total"] - before["trtspec_draft_tokens_total"]
    assert drafted == sum(r.draft_tokens for r in results)


def test_each_request_chooses_its_drafter(server, local):
    """draft_method per request: ngram, suffix, hybrid, none and the engine's own (Medusa) in flight together, every
    output equal to plain local decoding; requests without a drafter never draft, Medusa's (whole trees: tiny_repo)
    always does (hybrid's and the n-gram methods' drafts follow the verify curve measured on the server's machine)."""
    prompts = _prompts(10, seed=5)
    methods = ["ngram", "none", "medusa", "suffix", "hybrid"] * 2
    results = generate_concurrently(server.grpc_url, prompts, concurrency=10,
                                    options_for=lambda i: GenerationConfig(max_tokens=32, method=methods[i]))
    for i, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        assert result.output_ids == local.generate(prompts[i], GenerationConfig(max_tokens=32, no_spec=True)).output_ids
        if methods[i] == "none":
            assert result.draft_tokens == 0
    assert all(results[i].draft_tokens > 0 for i in range(10) if methods[i] == "medusa")


def test_suffix_requests_draft_from_the_deployed_datastore(server, local):
    """draft_method suffix over Triton looks up the repository's datastore (the engine's own replies to
    CORPUS_PROMPTS): on those prompts it accepts more drafted tokens than ngram, and every output is plain greedy."""
    from tests.triton.conftest import CORPUS_PROMPTS

    options = lambda method: GenerationConfig(max_tokens=48, method=method)  # noqa: E731
    with TritonClient(server.grpc_url) as client:
        ngram = [client.generate(p, options("ngram")) for p in CORPUS_PROMPTS]
        suffix = [client.generate(p, options("suffix")) for p in CORPUS_PROMPTS]
    for prompt, a, b in zip(CORPUS_PROMPTS, ngram, suffix):
        plain = local.generate(prompt, GenerationConfig(max_tokens=48, no_spec=True)).output_ids
        assert a.output_ids == b.output_ids == plain
    assert sum(r.accepted_tokens for r in suffix) > sum(r.accepted_tokens for r in ngram)


def test_lookahead_requests_choose_their_window(server, local):
    """draft_method lookahead with tensorrtllm_backend's lookahead_* sizes per request, through the ensemble: every
    output is plain greedy, whatever (W, N, G) each request runs."""
    from trtspec.speculative.lookahead_proposer import LookaheadConfig

    prompts = _prompts(6, seed=9)
    windows = [LookaheadConfig(2, 3, 2), None, LookaheadConfig(3, 2, 3), LookaheadConfig(2, 2, 1)] * 2
    results = generate_concurrently(server.grpc_url, prompts, concurrency=6, options_for=lambda i: GenerationConfig(
        max_tokens=32, method="lookahead", lookahead=windows[i]))
    for i, result in enumerate(results):
        assert not isinstance(result, BaseException), result
        assert result.output_ids == local.generate(prompts[i], GenerationConfig(max_tokens=32, no_spec=True)).output_ids
        assert result.draft_tokens > 0


def test_non_streaming_request_and_direct_engine_call(server, local):
    prompt = "Hello world"
    with TritonClient(server.grpc_url) as client:
        remote = client.generate(prompt, GenerationConfig(max_tokens=12), stream=False)
    expected = local.generate(prompt, GenerationConfig(max_tokens=12))
    assert remote.output_ids == expected.output_ids and remote.text == expected.text and remote.responses == 1
    # tensorrtllm_backend clients may talk to `tensorrt_llm` directly with token ids
    ids = local.encode(prompt)
    inputs = []
    for name, array in (("input_ids", np.array([ids], np.int32)), ("input_lengths", np.array([[len(ids)]], np.int32)),
                        ("request_output_len", np.array([[12]], np.int32))):
        tensor = grpcclient.InferInput(name, list(array.shape), "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    got = _stream_once(server.grpc_url, "tensorrt_llm", inputs)
    assert got[0][0].as_numpy("output_ids").reshape(-1).tolist() == ids + expected.output_ids  # prompt included


def test_stop_words_and_seeded_sampling(server, local):
    with TritonClient(server.grpc_url) as client:
        greedy = client.generate("quick brown fox", GenerationConfig(max_tokens=30))
        text = greedy.text
        stop = text[len(text) // 2:len(text) // 2 + 2].strip() or text[:1]
        stopped = client.generate("quick brown fox", GenerationConfig(max_tokens=30), stop_words=[stop])
        assert stopped.finish_reason in ("stop_word", "length")
        assert len(stopped.output_ids) <= len(greedy.output_ids)
        sampled = [client.generate("tokens", GenerationConfig(
            max_tokens=20, sampling=SamplingParams(temperature=1.0, top_k=50, seed=s)))
                   for s in (7, 7, 8)]
    assert sampled[0].output_ids == sampled[1].output_ids  # same seed, same tokens
    assert sampled[0].output_ids != sampled[2].output_ids


_stream_once = stream_once
_tensor = grpc_tensor


@pytest.mark.parametrize("stream", [False, True])
def test_text_output_reads_as_nvidias_clients_read_it(server, local, stream):
    """The requests tensorrtllm_backend's end_to_end_grpc_client.py sends (text_input, max_tokens, empty bad / stop
    words, stream), parsed as it parses them: `as_numpy("text_output")[0].decode("utf-8")` on a 1-D array."""
    inputs = [_tensor("text_input", np.array([[b"Hello world"]], np.object_)),
              _tensor("max_tokens", np.array([[16]], np.int32)),
              _tensor("bad_words", np.array([[b""]], np.object_)), _tensor("stop_words", np.array([[b""]], np.object_)),
              _tensor("exclude_input_in_output", np.array([[True]], bool)), _tensor("stream", np.array([[stream]], bool))]
    got = _stream_once(server.grpc_url, "ensemble", inputs)
    assert got and all(error is None for _, error in got)
    pieces = []
    for result, _ in got:
        output = result.as_numpy("text_output")
        assert output.ndim == 1 and isinstance(output[0], bytes)
        pieces.append(output[0].decode("utf-8"))
    assert (len(pieces) > 1) == stream
    # NVIDIA's client sends no apply_chat_template: the prompt is its text, as upstream's preprocessing makes it
    raw = local.tokenizer.encode("Hello world", add_special_tokens=True)
    assert "".join(pieces) == local.generate(raw, GenerationConfig(max_tokens=16)).text


@pytest.mark.parametrize("inputs,message", [
    ([("max_tokens", np.array([[8]], np.int32))], "text_input"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[0]], np.int32))],
     "max_tokens must be > 0, got 0"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[500]], np.int32))],
     "exceed the engine's max_seq_len 160"),
    ([("text_input", np.array([[" ".join(WORDS * 4).encode()]], np.object_)),
      ("max_tokens", np.array([[8]], np.int32))], "the engine's max_input_len is 64"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8.0]], np.float32))],
     "max_tokens"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("beam_width", np.array([[2]], np.int32))], "beam_width = 2 is not supported"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("repetition_penalty", np.array([[0.0]], np.float32))], "repetition_penalty must be > 0 (1 is off), got 0.0"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("draft_method", np.array([[b"lookup"]], np.object_))],
     "draft_method 'lookup' is not one of none, medusa, eagle, eagle2, ngram, suffix, lookahead, hybrid"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("draft_method", np.array([[b"eagle"]], np.object_))],
     "draft_method eagle: the engine was built for medusa"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("draft_method", np.array([[b"lookahead"]], np.object_)), ("lookahead_window_size", np.array([[5]], np.int32))],
     "lookahead_* (W, N, G) = 5,3,2 drafts up to 13 tokens a step ((W + G)(N - 1) - 1) but the engine's "
     "max_draft_len is 8"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("draft_method", np.array([[b"lookahead"]], np.object_)), ("lookahead_ngram_size", np.array([[1]], np.int32))],
     "lookahead ngram_size must be an int >= 2, got 1"),
    ([("text_input", np.array([[b"hi"]], np.object_)), ("max_tokens", np.array([[8]], np.int32)),
      ("lookahead_window_size", np.array([[2]], np.int32))], "send draft_method \"lookahead\" too"),
])
def test_bad_requests_get_an_error_and_the_server_keeps_serving(server, local, inputs, message):
    got = _stream_once(server.grpc_url, "ensemble", [_tensor(n, a) for n, a in inputs])
    errors = [str(e) for _, e in got if e is not None]
    assert errors and message in errors[0], errors
    with TritonClient(server.grpc_url) as client:
        assert client.generate("Hello world", GenerationConfig(max_tokens=8)).output_ids == \
            local.generate("Hello world", GenerationConfig(max_tokens=8)).output_ids


@pytest.mark.parametrize("ids", [[5, 2**31 - 1, 6], [-3]])
def test_token_ids_outside_the_vocabulary_are_refused_in_one_line(server, local, ids):
    """benchmark_core_model.py's token-norm-dist draws ids up to INT32_MAX: each such request gets one line naming
    the id and the vocabulary, the server logs no traceback, and keeps serving."""
    inputs = [_tensor("input_ids", np.array([ids], np.int32)), _tensor("input_lengths", np.array([[len(ids)]], np.int32)),
              _tensor("request_output_len", np.array([[4]], np.int32))]
    got = _stream_once(server.grpc_url, "tensorrt_llm", inputs)
    errors = [str(e) for _, e in got if e is not None]
    vocab = local.manifest.model.vocab_size
    bad = next(i for i, t in enumerate(ids) if not 0 <= t < vocab)
    assert errors and f"input_ids[0][{bad}] = {ids[bad]} is not a token id of this engine (its vocabulary is " \
        f"0..{vocab - 1})" in errors[0], errors
    assert not any("Traceback" in line for line in server.log_lines)
    with TritonClient(server.grpc_url) as client:
        assert client.generate("Hello world", GenerationConfig(max_tokens=8)).output_ids


def _counters_after_cancel(server, before, timeout=120.0, idle=False):
    """The counters once a cancellation shows in them (and, with `idle`, the batch and queue gauges read 0), or as they
    stand after `timeout` s: the engine model publishes twice a second, later on a loaded machine (a fixed 1 s settle
    missed it while a compiler held both cores), and one snapshot may hold the cancellation counted while the gauges
    were read a moment before the sequence left the batch."""
    import time

    deadline = time.monotonic() + timeout
    name = "trtspec_requests_cancelled_total"
    while True:
        after = read_counters(server.metrics_url)
        settled = after.get(name, 0) > before.get(name, 0) and (not idle or (
            after.get("trtspec_engine_sequences_in_flight") == 0 and after.get("trtspec_engine_queue_size") == 0))
        if settled or time.monotonic() > deadline:
            return after
        time.sleep(0.25)


def _start_long_stream(url, prompt="quick brown fox", max_tokens=120, model="ensemble", request_id=""):
    """A client with one long stream open; returns it once the first response came."""
    first = threading.Event()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result=None, error=None: first.set())
    if model == "ensemble":
        inputs = build_inputs(prompt, GenerationConfig(max_tokens=max_tokens), stream=True)
    else:
        inputs = [_tensor("input_ids", np.array([[5, 6, 7]], np.int32)), _tensor("input_lengths", np.array([[3]], np.int32)),
                  _tensor("request_output_len", np.array([[max_tokens]], np.int32)),
                  _tensor("streaming", np.array([[True]], bool))]
    client.async_stream_infer(model, inputs, request_id=request_id)
    assert first.wait(30)
    return client


def test_a_cancelled_stream_through_the_ensemble_stops_its_engine_request(long_server):
    """Triton's ensemble never cancels the engine request it is running; postprocessing sees the cancellation and
    stops it: the engine request of a 1,500-token stream ends as cancelled (not finished), its row is freed and
    nothing stays in flight, and a concurrent request completes exactly as it does alone."""
    url = long_server.grpc_url
    before = read_counters(long_server.metrics_url)
    other = {}
    thread = threading.Thread(target=lambda: other.update(r=generate_concurrently(
        url, ["Medusa heads"], GenerationConfig(max_tokens=60))[0]))
    client = _start_long_stream(url, max_tokens=1500)
    thread.start()
    client.stop_stream(cancel_requests=True)
    client.close()
    thread.join(120)
    after = _counters_after_cancel(long_server, before, idle=True)
    assert after["trtspec_requests_cancelled_total"] - before.get("trtspec_requests_cancelled_total", 0) == 1
    assert after["trtspec_engine_sequences_in_flight"] == 0 and after["trtspec_engine_queue_size"] == 0
    assert after["trtspec_kv_rows_used"] == 0
    with TritonClient(url) as again:
        alone = again.generate("Medusa heads", GenerationConfig(max_tokens=60))
    assert not isinstance(other["r"], BaseException), other["r"]
    assert other["r"].output_ids == alone.output_ids and len(alone.output_ids) == 60


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
def test_a_stop_request_with_the_request_id_ends_it(long_server, model):
    """inflight_batcher_llm_client.py --stop-after-ms: a second request to tensorrt_llm with the first one's id and
    stop = true (its other inputs dummies) ends the first, a 1,500-token request, as cancelled (not finished), and
    nothing stays in flight; the stop request gets one empty final response."""
    url = long_server.grpc_url
    before = read_counters(long_server.metrics_url)
    client = _start_long_stream(url, max_tokens=1500, model=model, request_id=f"stop-me-{model}")
    stop = [_tensor("input_ids", np.zeros((1, 1), np.int32)), _tensor("input_lengths", np.zeros((1, 1), np.int32)),
            _tensor("request_output_len", np.array([[0]], np.int32)), _tensor("stop", np.array([[True]], bool))]
    answer = _stream_once(url, "tensorrt_llm", stop, request_id=f"stop-me-{model}")
    assert answer == []  # one empty final response, no error
    client.stop_stream()
    client.close()
    after = _counters_after_cancel(long_server, before, idle=True)
    assert after["trtspec_requests_cancelled_total"] - before.get("trtspec_requests_cancelled_total", 0) == 1
    assert after["trtspec_engine_sequences_in_flight"] == 0 and after["trtspec_kv_rows_used"] == 0


def test_a_stop_request_without_an_id_is_refused(server):
    stop = [_tensor("input_ids", np.zeros((1, 1), np.int32)), _tensor("input_lengths", np.zeros((1, 1), np.int32)),
            _tensor("request_output_len", np.array([[0]], np.int32)), _tensor("stop", np.array([[True]], bool))]
    answer = _stream_once(server.grpc_url, "tensorrt_llm", stop)
    assert answer and "request id" in str(answer[0][1])


ABANDONING_CLIENT = """
import os, sys, threading
import tritonclient.grpc as grpcclient
from trtspec.speculative.loop import GenerationConfig
from trtspec.triton.client import build_inputs
first = threading.Event()
client = grpcclient.InferenceServerClient(sys.argv[1])
client.start_stream(callback=lambda result=None, error=None: first.set())
client.async_stream_infer("ensemble", build_inputs(sys.argv[2], GenerationConfig(max_tokens=1500), stream=True))
os._exit(0 if first.wait(30) else 1)  # gone with its stream open
"""


def test_abandoned_and_cancelled_streams_leave_nothing_in_flight(long_repo):
    """Four client processes exit with their streams open and four clients cancel theirs, all through the
    ensemble, with 1,500-token requests (half a minute each): the engine stops computing for all eight, nothing stays in
    flight, and SIGTERM stops the server with exit 0 well inside its exit timeout (Triton 2.51 waited the whole
    timeout for the stuck ensemble requests and exited 1)."""
    import subprocess
    import sys
    import time

    options = ServerOptions(repository=long_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=20)
    lines = []
    with TritonServer(options, on_log=lines.append) as running:
        abandoned = [subprocess.Popen([sys.executable, "-c", ABANDONING_CLIENT, running.grpc_url, f"abandoned {i}"])
                     for i in range(4)]
        assert all(process.wait(60) == 0 for process in abandoned)
        clients = [_start_long_stream(running.grpc_url, prompt, max_tokens=1500) for prompt in _prompts(4, seed=9)]
        for client in clients:
            client.stop_stream(cancel_requests=True)
            client.close()
        counters = {}
        deadline = time.monotonic() + 120  # a hang; the streams are cut within a few steps
        while time.monotonic() < deadline:  # the abandoned streams are noticed when the server next writes to them
            time.sleep(0.25)
            counters = read_counters(running.metrics_url)
            # one snapshot may count a cancellation while its gauges were read before the sequence left the batch
            if counters.get("trtspec_requests_cancelled_total") == 8 and not (
                    counters.get("trtspec_engine_sequences_in_flight") or counters.get("trtspec_kv_rows_used")):
                break
        # all eight ended as cancelled, none finished its 1,500 tokens, and no row is held: the engine stopped
        # computing for them (how many steps it ran before each cut depends on the machine's load: not asserted)
        assert counters["trtspec_requests_cancelled_total"] == 8, counters
        assert counters["trtspec_engine_sequences_in_flight"] == 0 and counters["trtspec_kv_rows_used"] == 0
        code = running.stop()
    # exit 0 and no model left with in-flight inferences: Triton did not wait out its exit timeout for stuck
    # requests (it exits 1 then); the wall time of the stop depends on the machine's load and is not asserted
    assert code == 0, "\n".join(lines[-20:])
    assert not any("in-flight inferences" in line and "has " in line for line in lines)


def test_the_gauges_move_as_requests_queue_and_finish(long_repo):
    """/metrics while ten 1,500-token streams run on an 8-row engine: 8 sequences in flight, 2 queued, 8 KV rows used
    and none free, 8 sequences in the last step; once they are cancelled, all back to 0 (8 rows free) and the
    cancelled counter up by 10 (Triton's own nv_inference_pending_request_count cannot show this backlog)."""
    import time

    options = ServerOptions(repository=long_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=10)
    gauges = ("trtspec_engine_sequences_in_flight", "trtspec_engine_queue_size", "trtspec_kv_rows_used",
              "trtspec_kv_rows_free", "trtspec_engine_last_step_sequences")

    def wait_for(expected):
        from urllib.error import URLError

        seen = {}
        deadline = time.monotonic() + 120  # a hang: each state holds until the test moves on
        while time.monotonic() < deadline:
            try:
                seen = read_counters(running.metrics_url)
            except URLError:  # the metrics endpoint may open a moment after the server reports ready
                time.sleep(0.25)
                continue
            if all(seen.get(name) == value for name, value in expected.items()):
                return seen
            time.sleep(0.25)
        raise AssertionError(f"{expected} never seen; last {dict((n, seen.get(n)) for n in gauges)}")

    with TritonServer(options, on_log=lambda line: None) as running:
        idle = wait_for({"trtspec_engine_sequences_in_flight": 0, "trtspec_engine_queue_size": 0,
                         "trtspec_kv_rows_used": 0, "trtspec_kv_rows_free": 8})
        clients = []
        try:
            for prompt in _prompts(10, seed=3):  # the last two wait for a row: no first response to wait for
                client = grpcclient.InferenceServerClient(running.grpc_url)
                client.start_stream(callback=lambda result=None, error=None: None)
                clients.append(client)
                client.async_stream_infer("ensemble", build_inputs(prompt, GenerationConfig(max_tokens=1500), stream=True))
            wait_for({"trtspec_engine_sequences_in_flight": 8, "trtspec_engine_queue_size": 2,
                      "trtspec_kv_rows_used": 8, "trtspec_kv_rows_free": 0, "trtspec_engine_last_step_sequences": 8})
        finally:
            for client in clients:
                client.stop_stream(cancel_requests=True)
                client.close()
        after = wait_for({"trtspec_engine_sequences_in_flight": 0, "trtspec_engine_queue_size": 0,
                          "trtspec_kv_rows_used": 0, "trtspec_kv_rows_free": 8})
        cancelled = after["trtspec_requests_cancelled_total"] - idle.get("trtspec_requests_cancelled_total", 0)
        assert cancelled == 10, cancelled


def test_generate_url_cli_json_matches_local(server, tiny_engine, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts(4, seed=3)))
    runner = CliRunner()
    remote = runner.invoke(cli, ["generate", "--url", server.grpc_url, "--prompts", str(prompts), "--max-tokens",
                                 "16", "--json", "--concurrency", "2"])
    local = runner.invoke(cli, ["generate", str(tiny_engine), "--prompts", str(prompts), "--max-tokens", "16",
                                "--json"])
    assert remote.exit_code == 0 and local.exit_code == 0, remote.output + local.output
    rows = [json.loads(line) for line in remote.output.splitlines()]
    want = [json.loads(line) for line in local.output.splitlines()]
    assert [(r["prompt_index"], r["output_ids"], r["text"]) for r in rows] == \
        [(r["prompt_index"], r["output_ids"], r["text"]) for r in want]
    streamed = runner.invoke(cli, ["generate", "--url", server.grpc_url, "--prompt", "Hello world",
                                   "--max-tokens", "16"])
    assert streamed.exit_code == 0 and streamed.output.rstrip("\n") == want[0]["text"] or streamed.output


def test_clear_errors_without_a_server(tmp_path, monkeypatch, tiny_repo):
    runner = CliRunner()
    result = runner.invoke(cli, ["generate", "--url", "127.0.0.1:1", "--prompt", "hi"])
    assert result.exit_code == 1 and "cannot reach a Triton server at 127.0.0.1:1" in result.output
    result = runner.invoke(cli, ["serve", str(tmp_path)])
    assert result.exit_code == 1 and "is not a trtspec model repository" in result.output
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("trtspec.triton.server._bundled", lambda: None)
    with pytest.raises(ServerError, match="no tritonserver found.*pip install 'trtspec\\[serve\\]'"):
        find_tritonserver()


def test_server_start_failure_is_reported(tmp_path, tiny_repo):
    broken = tmp_path / "repo"
    import shutil

    shutil.copytree(tiny_repo, broken)
    config = broken / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    config.write_text(text.replace('string_value: "../', 'string_value: "../missing/'))
    from trtspec.triton.server import free_port

    options = ServerOptions(repository=broken, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), startup_timeout_s=120)
    # an engine the repository cannot find: one line before tritonserver starts
    with pytest.raises(ServerError, match=r"^tensorrt_llm: engine_dir \.\./missing/.*: no manifest.json; not an "
                                          r"engine directory"):
        TritonServer(options, on_log=lambda line: None).start()
    # a model that fails to load: reported as the server's exit (with the load error), not as a start-up timeout
    config.write_text(text)
    model = broken / "postprocessing" / "1" / "model.py"
    model.write_text("this is not python\n" + model.read_text())
    with pytest.raises(ServerError, match="tritonserver exited with code 1 while starting: .*failed to load"):
        TritonServer(options, on_log=lambda line: None).start()


def _wait_for_metrics(metrics_url, expected: dict, timeout=120.0) -> dict:
    """The counters once every name in `expected` reads its value (a hang after `timeout` s)."""
    import time
    from urllib.error import URLError

    deadline, seen = time.monotonic() + timeout, {}
    while time.monotonic() < deadline:
        try:
            seen = read_counters(metrics_url)
        except URLError:  # the metrics endpoint may open a moment after the server reports ready
            seen = {}
        if all(seen.get(name) == value for name, value in expected.items()):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"{expected} never seen; last {dict((n, seen.get(n)) for n in expected)}")


def test_non_decoupled_repository_serves_unary_requests(long_engine, tmp_path):
    """--no-decoupled: plain ModelInfer calls (no stream) through the ensemble and to tensorrt_llm directly, batched
    in flight by the decoupled engine behind the unary forwarder; a unary stop request ends a request by its id.

    Arrival is controlled, not left to the machine's load: a 1,500-token unary request (some 1,500 slow steps) is
    in the batch before six more are sent at once, and is stopped by its id only after they all returned. So it ran
    in every verify step, and every step of the six was shared with it: the engine's steps are the held request's,
    its sequences the held request's steps plus the six's (requests sent at once are batched in flight, not run one
    execute call each in turn)."""
    from trtspec.triton.deploy import deploy
    from trtspec.triton.deploy_options import DeployOptions
    from trtspec.triton.server import free_port

    # whole trees (no back-off, whose choices follow the drafter's measured time): a request's steps are the same in
    # flight as alone in process
    repo = deploy(DeployOptions(engine_dir=long_engine, out=tmp_path / "repo", decoupled=False, threads=1,
                                backoff=False))
    local = LocalGenerator(long_engine, threads=1, backoff=False)
    options = ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=5)
    metrics_url = f"http://127.0.0.1:{options.metrics_port}/metrics"
    prompts = _prompts(6, seed=4)

    def direct_inputs(ids, max_tokens):
        return [grpc_tensor("input_ids", np.array([ids], np.int32)),
                grpc_tensor("input_lengths", np.array([[len(ids)]], np.int32)),
                grpc_tensor("request_output_len", np.array([[max_tokens]], np.int32)),
                grpc_tensor("exclude_input_in_output", np.array([[True]], bool))]

    with TritonServer(options, on_log=lambda line: None) as running:
        held = {}

        def hold():
            client = grpcclient.InferenceServerClient(running.grpc_url)
            held["result"] = client.infer("tensorrt_llm", direct_inputs([5, 6, 7], 1500), request_id="held")
            client.close()

        holder = threading.Thread(target=hold)
        holder.start()
        _wait_for_metrics(metrics_url, {"trtspec_engine_sequences_in_flight": 1})  # the held request is in the batch
        outputs = [None] * len(prompts)

        def call(i):
            client = grpcclient.InferenceServerClient(running.grpc_url)
            inputs = build_inputs(prompts[i], GenerationConfig(max_tokens=10 + i), stream=False)
            outputs[i] = client.infer("ensemble", inputs)
            client.close()

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        client = grpcclient.InferenceServerClient(running.grpc_url)
        stop = [grpc_tensor("input_ids", np.zeros((1, 1), np.int32)),
                grpc_tensor("input_lengths", np.zeros((1, 1), np.int32)),
                grpc_tensor("request_output_len", np.array([[0]], np.int32)),
                grpc_tensor("stop", np.array([[True]], bool))]
        assert not client.infer("tensorrt_llm", stop, request_id="held").get_response().outputs  # answered empty
        holder.join(120)
        result = held["result"]
        assert result.as_numpy("finish_reason").reshape(-1)[0] == b"cancelled"
        held_steps = int(result.as_numpy("num_verify_steps").reshape(-1)[0])
        assert 0 < held_steps and result.as_numpy("sequence_length").reshape(-1)[0] < 1500
        # a one-token request: the engine model publishes its counters when a request arrives, so they now hold
        # every step (that request ends at its prefill and runs no step)
        client.infer("tensorrt_llm", direct_inputs([5], 1))
        counters = read_counters(metrics_url)
        six_steps = sum(int(o.as_numpy("num_verify_steps").reshape(-1)[0]) for o in outputs)
        assert counters["trtspec_engine_steps_total"] == held_steps
        assert counters["trtspec_engine_step_sequences_total"] == held_steps + six_steps
        with pytest.raises(Exception, match="Streaming is only supported in decoupled mode"):
            client.infer("ensemble", build_inputs("hi", GenerationConfig(max_tokens=4), stream=True))
        direct = client.infer("tensorrt_llm", direct_inputs(local.encode(prompts[0]), 10))
        assert direct.as_numpy("output_ids").reshape(-1).tolist() == outputs[0].as_numpy("output_ids").reshape(-1).tolist()
        bls = client.infer("tensorrt_llm_bls", build_inputs(prompts[0], GenerationConfig(max_tokens=10), stream=False))
        assert bls.as_numpy("text_output")[0] == outputs[0].as_numpy("text_output")[0]
        client.close()
    for i, result in enumerate(outputs):
        expected = local.generate(prompts[i], GenerationConfig(max_tokens=10 + i))
        assert result.as_numpy("output_ids").reshape(-1).tolist() == expected.output_ids
        assert b"".join(result.as_numpy("text_output").reshape(-1)).decode() == expected.text
        assert result.as_numpy("num_verify_steps").reshape(-1)[0] == expected.result.stats.steps


def test_serving_docs_client_example_runs_against_the_server(server, local, capsys):
    """docs/serving.md's client (tritonclient only, no trtspec import) streams the same text as local generation."""
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "serving.md").read_text()
    blocks = [b.split("```", 1)[0] for b in page.split("```python\n")[1:]]
    (example,) = [b for b in blocks if "tritonclient.grpc as grpcclient" in b]
    assert "trtspec" not in example
    exec(compile(example.replace("127.0.0.1:8001", server.grpc_url), "docs/serving.md", "exec"), {})
    printed = capsys.readouterr().out
    prompt = "Explain speculative decoding in one sentence."
    assert printed == local.generate(prompt, GenerationConfig(max_tokens=64)).text


def _serve(repo, grpc_port, *extra):
    """`trtspec serve` as a user runs it; returns the process once its banner (on stderr) is out, and the lines."""
    import subprocess
    import sys

    argv = [sys.executable, "-m", "trtspec.cli", "serve", str(repo), "--grpc-port", str(grpc_port),
            "--http-port", str(free_port()), "--metrics-port", str(free_port()), *extra]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if line.startswith("serving "):
            break
    threading.Thread(target=lambda: lines.extend(process.stderr), daemon=True).start()
    return process, lines


def test_serve_command_prints_endpoints_and_stops_on_sigterm(tiny_repo):
    """`trtspec serve`: ready, endpoints printed on stderr (stdout stays clean), SIGTERM stops it and the server
    with exit 0, and a new server on the same ports starts at once."""
    import signal
    import subprocess

    grpc_port = free_port()
    for _ in range(2):  # the second on the ports the first just released
        process, lines = _serve(tiny_repo, grpc_port)
        try:
            assert lines[-1].startswith(f"serving {tiny_repo}: gRPC 127.0.0.1:{grpc_port}, HTTP 127.0.0.1:"), lines
            # a CPU-only host: tritonserver's CUDA / NVML / DCGM lines are left out, one note says so
            assert not any(CPU_HOST_NOISE.search(line) for line in lines), lines
            assert sum(line.startswith("(trtspec leaves out tritonserver's lines about a GPU") for line in lines) == 1
            with TritonClient(f"127.0.0.1:{grpc_port}") as client:
                assert client.generate("Hello world", GenerationConfig(max_tokens=4)).output_ids
            process.send_signal(signal.SIGTERM)
            assert process.wait(60) == 0
            assert process.stdout.read() == ""
        finally:
            if process.poll() is None:
                process.kill()
        leftover = subprocess.run(["pgrep", "-f", f"--grpc-port={grpc_port}"], capture_output=True, text=True)
        assert leftover.stdout.strip() == "", "tritonserver still running"


def test_serve_exits_with_tritonservers_status(tiny_repo):
    """tritonserver killed under it: `serve` exits 137 (128 + SIGKILL) and says so in one line."""
    import signal
    import subprocess

    grpc_port = free_port()
    process, lines = _serve(tiny_repo, grpc_port)
    try:
        pids = subprocess.run(["pgrep", "-f", f"tritonserver.*--grpc-port={grpc_port}"], capture_output=True,
                              text=True).stdout.split()
        assert pids
        os.killpg(int(pids[0]), signal.SIGKILL)  # its whole session: the model stubs too, or they linger
        assert process.wait(60) == 137
        assert any(line.startswith("Error: tritonserver exited with status 137") for line in lines), lines[-5:]
    finally:
        if process.poll() is None:
            process.kill()


def test_a_port_held_by_a_listener_is_named(tiny_repo):
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        options = ServerOptions(repository=tiny_repo, grpc_port=port, http_port=free_port(), metrics_port=free_port(),
                                port_wait_s=0.5)
        with pytest.raises(ServerError, match=rf"port {port} on 127.0.0.1 is in use by pid {os.getpid()} \("):
            TritonServer(options).start()


@pytest.mark.parametrize("model", ["tensorrt_llm", "ensemble"])
@pytest.mark.parametrize("max_tokens, drain_s, ends_in_error", [(30, 120.0, False), (1500, 1.0, True)])
def test_stopping_drains_the_engine_first(long_repo, max_tokens, drain_s, ends_in_error, model):
    """Stop with a stream in flight: a request that finishes within the drain time completes (30 tokens, a drain
    time no machine's load stretches them past; the stop goes on as soon as the engine is idle); one that does
    not is ended (1,500 tokens and a drain of 1 s; a direct client gets a final error saying the server is shutting
    down). Either way the server then stops with exit 0 (not killed at its exit timeout), through the ensemble too."""
    import time

    options = ServerOptions(repository=long_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), drain_s=drain_s, exit_timeout_s=5)
    errors, first, final = [], threading.Event(), threading.Event()

    def callback(result=None, error=None):
        if error is not None:
            errors.append(str(error))
            final.set()
        elif result.get_response().parameters["triton_final_response"].bool_param:
            final.set()
        first.set()

    with TritonServer(options, on_log=lambda line: None) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        client.start_stream(callback=callback)
        if model == "ensemble":
            client.async_stream_infer("ensemble", build_inputs("quick brown fox", GenerationConfig(max_tokens=max_tokens),
                                                               stream=True), enable_empty_final_response=True)
        else:
            client.async_stream_infer("tensorrt_llm", [
                _tensor("input_ids", np.array([[5, 6, 7]], np.int32)), _tensor("input_lengths", np.array([[3]], np.int32)),
                _tensor("request_output_len", np.array([[max_tokens]], np.int32)),
                _tensor("streaming", np.array([[True]], bool))], enable_empty_final_response=True)
        assert first.wait(30)
        codes = []
        stopping = threading.Thread(target=lambda: codes.append(running.stop()))
        start = time.monotonic()
        stopping.start()
        assert final.wait(120)
        client.stop_stream()
        client.close()
        stopping.join(300)
        took = time.monotonic() - start
    print(f"stop with a {max_tokens}-token stream in flight: {took:.2f} s")  # shown with -s; load-dependent
    assert codes == [0]
    # through the ensemble a stream ending after its first response ends without an error (Triton 2.51's ensemble
    # never finishes a request whose step failed while another was in flight; docs/serving-faults.md)
    assert bool(errors) == (ends_in_error and model == "tensorrt_llm"), errors
    if errors:
        assert "the server is shutting down (its drain time is over)" in errors[0]


def test_sigterm_mid_load_stops_serve_within_five_seconds_by_default(long_repo):
    """`trtspec serve` with its default drain time, eight 1,500-token streams through the ensemble in flight (half a
    minute of work each): SIGTERM ends them through the drain (they cannot finish within it) and stops the server
    with exit 0, each stream gets its final response, and no server process is left. The issue's target is 5 s;
    the time taken is printed (-s), not asserted: it depends on the machine's load."""
    import signal
    import subprocess
    import time

    grpc_port = free_port()
    process, lines = _serve(long_repo, grpc_port)
    finals, clients = [], []
    try:
        for prompt in _prompts(8, seed=5):
            first, final = threading.Event(), threading.Event()

            def callback(result=None, error=None, first=first, final=final):
                first.set()
                if error is not None or result.get_response().parameters["triton_final_response"].bool_param:
                    final.set()

            client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
            client.start_stream(callback=callback)
            client.async_stream_infer("ensemble", build_inputs(prompt, GenerationConfig(max_tokens=1500), stream=True),
                                      enable_empty_final_response=True)
            clients.append((client, first))
            finals.append(final)
        assert all(first.wait(60) for _, first in clients)
        start = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert all(final.wait(120) for final in finals)
        for client, _ in clients:  # a client closes its stream after the final response (every upstream client does)
            client.stop_stream()
            client.close()
        code = process.wait(60)
        took = time.monotonic() - start
    finally:
        if process.poll() is None:
            process.kill()
    print(f"SIGTERM mid-load: exit {code} after {took:.2f} s")  # shown with -s
    # exit 0: Triton did not wait out its exit timeout for stuck requests (it exits 1 then); the drain, not the
    # requests' own end, ended them
    assert code == 0, "".join(lines[-20:])
    assert any("drain time over" in line for line in lines), "".join(lines[-20:])
    assert not any("in-flight inferences" in line and "has " in line for line in lines), "".join(lines[-20:])
    leftover = subprocess.run(["pgrep", "-f", f"--grpc-port={grpc_port}"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "tritonserver still running"


def test_log_probs_match_local_generation(server, local):
    """return_log_probs: output_log_probs per generated token and their sum, as the in-process loop computes."""
    from trtspec.speculative.loop import GenerationConfig, generate

    ids = local.tokenizer.encode(add_special_tokens=True, text="Medusa heads")
    expected = generate(local.engine, ids, local.proposer(), GenerationConfig(max_tokens=12, return_log_probs=True))
    inputs = [_tensor("text_input", np.array([[b"Medusa heads"]], np.object_)),
              _tensor("max_tokens", np.array([[12]], np.int32)), _tensor("stream", np.array([[True]], np.bool_)),
              _tensor("return_log_probs", np.array([[True]], np.bool_))]
    got = _stream_once(server.grpc_url, "ensemble", inputs)
    values = np.concatenate([r.as_numpy("output_log_probs").reshape(-1) for r, _ in got])
    tokens = np.concatenate([r.as_numpy("output_ids").reshape(-1) for r, _ in got])
    assert tokens.tolist() == expected.output_ids
    np.testing.assert_allclose(values, expected.log_probs, rtol=1e-5, atol=1e-5)
    assert all(v <= 0 for v in values)
    np.testing.assert_allclose(got[-1][0].as_numpy("cum_log_probs").reshape(-1)[0], sum(expected.log_probs),
                               rtol=1e-5)


def test_bad_words_and_min_tokens_are_honoured(server, local):
    """bad_words: the words never appear (the same rule as in-process); min_tokens: no end before it."""
    from trtspec.speculative.loop import GenerationConfig, generate

    ids = local.tokenizer.encode(add_special_tokens=True, text="quick brown fox")
    plain = generate(local.engine, ids, local.proposer(), GenerationConfig(max_tokens=24))
    banned = plain.output_ids[3:5]  # a two-token sequence greedy decoding produces
    word = local.tokenizer.decode(banned)
    expected = generate(local.engine, ids, local.proposer(), GenerationConfig(
        max_tokens=24, bad_words=(tuple(local.tokenizer.encode(word)),)))
    inputs = [_tensor("text_input", np.array([[b"quick brown fox"]], np.object_)),
              _tensor("max_tokens", np.array([[24]], np.int32)), _tensor("stream", np.array([[False]], np.bool_)),
              _tensor("exclude_input_in_output", np.array([[True]], np.bool_)),
              _tensor("bad_words", np.array([[word.encode()]], np.object_)),
              _tensor("min_tokens", np.array([[24]], np.int32))]
    got = _stream_once(server.grpc_url, "ensemble", inputs)
    tokens = got[0][0].as_numpy("output_ids").reshape(-1).tolist()
    assert tokens == expected.output_ids != plain.output_ids
    bad = tuple(local.tokenizer.encode(word))
    assert all(tuple(tokens[i:i + len(bad)]) != bad for i in range(len(tokens)))


def test_penalties_are_applied_as_in_process_and_by_the_client(server, local):
    """repetition / presence / frequency penalties: the server's tokens equal in-process generation with the same
    penalties (which speculation keeps: tests/speculative/test_penalties.py), sent as raw tensors or by TritonClient."""
    from trtspec.speculative.loop import GenerationConfig, generate
    from trtspec.speculative.penalties import Penalties

    penalties = Penalties(repetition=1.3, presence=0.4, frequency=0.2)
    ids = local.tokenizer.encode(add_special_tokens=True, text="quick brown fox")
    plain = generate(local.engine, ids, local.proposer(), GenerationConfig(max_tokens=24))
    expected = generate(local.engine, ids, local.proposer(), GenerationConfig(max_tokens=24, penalties=penalties))
    inputs = [_tensor("text_input", np.array([[b"quick brown fox"]], np.object_)),
              _tensor("max_tokens", np.array([[24]], np.int32)), _tensor("stream", np.array([[False]], np.bool_)),
              _tensor("exclude_input_in_output", np.array([[True]], np.bool_)),
              _tensor("repetition_penalty", np.array([[1.3]], np.float32)),
              _tensor("presence_penalty", np.array([[0.4]], np.float32)),
              _tensor("frequency_penalty", np.array([[0.2]], np.float32))]
    got = _stream_once(server.grpc_url, "ensemble", inputs)
    assert got[0][0].as_numpy("output_ids").reshape(-1).tolist() == expected.output_ids != plain.output_ids
    with TritonClient(server.grpc_url) as client:  # the chat-templated prompt, as in-process generate renders it
        reply = client.generate("quick brown fox", GenerationConfig(max_tokens=24, penalties=penalties))
    assert reply.output_ids == local.generate("quick brown fox", GenerationConfig(max_tokens=24,
                                                                                   penalties=penalties)).output_ids


def test_the_python_models_import_the_trtspec_that_starts_the_server():
    """A source tree on PYTHONPATH (a worktree, a checkout beside an editable install) is what the models import: its
    folder comes first on TRTSPEC_SITE_PACKAGES."""
    from pathlib import Path

    import trtspec

    first = find_tritonserver().env["TRTSPEC_SITE_PACKAGES"].split(os.pathsep)[0]
    assert Path(first) == Path(trtspec.__file__).resolve().parent.parent


def test_free_port_never_hands_out_the_same_port_twice(monkeypatch):
    """The OS may give two binds in a row the same ephemeral port; a server's three ports must still differ."""
    import socket

    from trtspec.triton import server

    ports = iter([50001, 50001, 50001, 50002])

    class Socket:
        def __init__(self, *args):
            self.port = next(ports)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            pass

        def getsockname(self):
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(server, "_HANDED_OUT", set())
    monkeypatch.setattr(socket, "socket", Socket)
    assert [server.free_port(), server.free_port()] == [50001, 50002]
