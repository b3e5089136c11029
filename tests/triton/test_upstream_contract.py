"""The CPU flavour against tensorrtllm_backend's client contract, served for real: requests shaped exactly as NVIDIA's
clients send them (text_input, max_tokens, temperature 1.0 and nothing else; upstream's optional inputs), answers
parsed as they parse them (`as_numpy(name)[0]`, `[0][0]`)."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig, generate
from trtspec.speculative.sampling import SamplingParams
from trtspec.testing.grpc_requests import grpc_tensor as tensor
from trtspec.testing.grpc_requests import stream_once
from trtspec.triton.contract import PERF_METRIC_OUTPUTS


@pytest.fixture(scope="module")
def local(tiny_engine):
    return LocalGenerator(tiny_engine, threads=1)


def _text(value: str):
    return np.array([[value.encode()]], np.object_)


def _request(prompt: str, max_tokens: int, **extra) -> list:
    inputs = [tensor("text_input", _text(prompt)), tensor("max_tokens", np.array([[max_tokens]], np.int32))]
    return inputs + [tensor(name, value) for name, value in extra.items()]


def _raw(local, text: str) -> list[int]:
    """The prompt upstream's preprocessing makes of a text: the text itself, no chat template."""
    return local.tokenizer.encode(text, add_special_tokens=True)


def _ids(got) -> list[int]:
    return np.concatenate([r.as_numpy("output_ids").reshape(-1) for r, _ in got]).tolist()


def test_upstream_defaults_are_greedy(server, local):
    """end_to_end_grpc_client.py sends temperature 1.0 and no top_k / top_p: TensorRT-LLM decodes greedily then
    (top_k 0 and top_p 0), so three runs give the same text, plain greedy decoding's."""
    inputs = lambda: _request("quick brown fox", 24, temperature=np.array([[1.0]], np.float32),  # noqa: E731
                              exclude_input_in_output=np.array([[True]], bool))
    runs = [_ids(stream_once(server.grpc_url, "ensemble", inputs())) for _ in range(3)]
    greedy = local.generate(_raw(local, "quick brown fox"), _options(24, no_spec=True)).output_ids
    assert runs[0] == runs[1] == runs[2] == greedy


def test_top_p_alone_samples_at_the_temperature(server, local):
    """top_p > 0 (with top_k 0) is nucleus sampling: different seeds give different texts, one seed one text."""
    def run(seed):
        return _ids(stream_once(server.grpc_url, "ensemble", _request(
            "quick brown fox", 32, temperature=np.array([[1.5]], np.float32), top_p=np.array([[1.0]], np.float32),
            random_seed=np.array([[seed]], np.uint64), exclude_input_in_output=np.array([[True]], bool))))
    first = run(1)
    assert run(1) == first
    assert any(run(seed) != first for seed in (2, 3, 4))


def test_optional_outputs_only_when_asked(server):
    """Log probabilities and perf metrics come back only with return_log_probs / return_perf_metrics, as upstream;
    the perf metrics have upstream's dtypes and [1, 1] shapes, times in order, draft counters as trtspec's."""
    outputs = [grpcclient.InferRequestedOutput(name) for name in
               ("text_output", "cum_log_probs", "output_log_probs", *(t.name for t in PERF_METRIC_OUTPUTS))]
    plain = stream_once(server.grpc_url, "ensemble", _request("Medusa heads", 12), outputs=outputs)
    result = plain[-1][0]
    assert result.as_numpy("output_log_probs") is None and result.as_numpy("arrival_time_ns") is None
    asked = stream_once(server.grpc_url, "ensemble", _request(
        "Medusa heads", 12, stream=np.array([[True]], bool), return_log_probs=np.array([[True]], bool),
        return_perf_metrics=np.array([[True]], bool)),
        outputs=outputs + [grpcclient.InferRequestedOutput(n) for n in ("num_draft_tokens", "num_accepted_tokens")])
    last = asked[-1][0]
    dtypes = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}
    for t in PERF_METRIC_OUTPUTS:
        value = last.as_numpy(t.name)
        assert value.shape == (1, 1) and value.dtype == dtypes[t.data_type], t.name
    metric = lambda name: last.as_numpy(name)[0][0]  # noqa: E731  (as end_to_end_grpc_client.py reads them)
    assert 0 < metric("arrival_time_ns") <= metric("first_scheduled_time_ns") <= metric("first_token_time_ns") \
        <= metric("last_token_time_ns") <= time.monotonic_ns()
    assert metric("total_draft_tokens") == last.as_numpy("num_draft_tokens")[0][0]
    assert metric("total_accepted_draft_tokens") == last.as_numpy("num_accepted_tokens")[0][0]
    drafted = metric("total_draft_tokens")
    assert metric("acceptance_rate") == pytest.approx(metric("total_accepted_draft_tokens") / drafted if drafted else 0)
    assert (metric("kv_cache_alloc_new_blocks"), metric("kv_cache_reused_blocks"),
            metric("kv_cache_alloc_total_blocks")) == (1, 0, 1)
    assert all(r.as_numpy("output_log_probs") is not None for r, _ in asked)


def test_echo_is_the_clients_text_plus_the_completion(server, local):
    """exclude_input_in_output false: text_output = text_input + completion, with or without the chat template
    (the template is the server's business, not part of the client's prompt)."""
    prompt = "speculative decoding"
    for template in (False, True):
        got = stream_once(server.grpc_url, "ensemble", _request(
            prompt, 16, exclude_input_in_output=np.array([[False]], bool),
            apply_chat_template=np.array([[template]], bool)))
        (result, error), = got
        assert error is None
        text = result.as_numpy("text_output")[0].decode("utf-8")
        ids = local.encode(prompt) if template else _raw(local, prompt)
        completion = local.generate(ids, _options(16)).output_ids
        assert result.as_numpy("output_ids").reshape(-1).tolist() == _raw(local, prompt) + completion
        assert text == local.tokenizer.decode(_raw(local, prompt) + completion)
        assert text.startswith(prompt)


def test_embedding_bias_words_are_honoured_losslessly(server, local):
    """embedding_bias_words / _weights: every token of each word gets its weight added to the logits of every
    step, as upstream's preprocessing builds the bias; speculative output equals plain decoding with the bias."""
    prompt, word = "quick brown fox", "Medusa"
    bias_tokens = local.tokenizer.encode(word)
    bias = GenerationConfig(max_tokens=20, logit_bias=tuple((t, 6.0) for t in bias_tokens),
                            sampling=SamplingParams())
    ids = _raw(local, prompt)
    plain = generate(local.engine, ids, local.proposer(GenerationConfig(no_spec=True)), bias).output_ids
    spec = generate(local.engine, ids, local.proposer(), bias).output_ids
    unbiased = generate(local.engine, ids, local.proposer(GenerationConfig(no_spec=True)), GenerationConfig(max_tokens=20)).output_ids
    assert plain == spec != unbiased
    got = stream_once(server.grpc_url, "ensemble", _request(
        prompt, 20, exclude_input_in_output=np.array([[True]], bool),
        embedding_bias_words=np.array([[word.encode()]], np.object_),
        embedding_bias_weights=np.array([[6.0]], np.float32)))
    assert _ids(got) == plain


@pytest.mark.parametrize("name,value,message", [
    ("lora_task_id", np.array([[7]], np.uint64), "lora_task_id: LoRA adapters is not supported"),
    ("guided_decoding_guide_type", _text("json"), "guided_decoding_guide_type: guided decoding is not supported"),
    ("prompt_vocab_size", np.array([[4]], np.int32), "prompt_vocab_size: prompt tuning is not supported"),
    ("decoder_text_input", _text("x"), "decoder_text_input is for encoder-decoder models"),
    ("embedding_bias_words", np.array([[b"fox"]], np.object_), "embedding_bias_words and embedding_bias_weights go "
                                                              "together"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_inputs_the_engine_cannot_honour_get_one_line_and_no_wait(server, name, value, message, stream):
    """Upstream inputs the CPU engine cannot honour are declared, so the client gets trtspec's own line naming the
    input (not Triton's generic "unexpected inference input") as the stream's one response, and the stream ends
    (stream_once fails on a stream left open; how fast the answer comes depends on the machine's load)."""
    got = stream_once(server.grpc_url, "ensemble", _request("hi", 8, stream=np.array([[stream]], bool),
                                                             **{name: value}), timeout=120)
    errors = [str(e) for _, e in got if e is not None]
    assert errors and message in errors[0], errors
    assert len(got) == 1, got  # the error alone: no output before it


def test_preprocessing_sends_upstreams_decoder_outputs(server):
    """end_to_end_test.py calls preprocessing alone and reads DECODER_INPUT_ID (a decoder-only model: [[pad_id]]),
    then sends it to tensorrt_llm as decoder_input_ids."""
    client = grpcclient.InferenceServerClient(server.grpc_url)
    result = client.infer("preprocessing", [tensor("QUERY", _text("quick brown fox")),
                                            tensor("REQUEST_OUTPUT_LEN", np.array([[8]], np.int32)),
                                            tensor("BAD_WORDS_DICT", np.array([[b""]], np.object_)),
                                            tensor("STOP_WORDS_DICT", np.array([[b""]], np.object_))])
    decoder = result.as_numpy("DECODER_INPUT_ID")
    assert decoder.shape == (1, 1) and decoder[0][0] == result.as_numpy("OUT_PAD_ID")[0][0]
    assert result.as_numpy("REQUEST_DECODER_INPUT_LEN").tolist() == [[1]]
    assert result.as_numpy("EMBEDDING_BIAS").shape == (1, 0)
    client.close()
    got = stream_once(server.grpc_url, "tensorrt_llm", [
        tensor("input_ids", result.as_numpy("INPUT_ID")), tensor("input_lengths", result.as_numpy("REQUEST_INPUT_LEN")),
        tensor("request_output_len", result.as_numpy("REQUEST_OUTPUT_LEN")), tensor("decoder_input_ids", decoder)])
    assert got and all(e is None for _, e in got)


def _options(max_tokens: int, **kw):
    from trtspec.speculative.loop import GenerationConfig

    return GenerationConfig(max_tokens=max_tokens, **kw)


@pytest.mark.parametrize("stream", [False, True])
def test_tensorrt_llm_bls_answers_as_the_ensemble(server, stream):
    """tensorrt_llm_bls (upstream's BLS interface, num_draft_tokens among its inputs) gives the ensemble's text."""
    inputs = lambda model: _request("Medusa heads", 16, stream=np.array([[stream]], bool),  # noqa: E731
                                    exclude_input_in_output=np.array([[True]], bool),
                                    **({"num_draft_tokens": np.array([[4]], np.int32)} if model != "ensemble" else {}))
    texts = {}
    for model in ("ensemble", "tensorrt_llm_bls"):
        got = stream_once(server.grpc_url, model, inputs(model))
        assert got and all(e is None for _, e in got)
        texts[model] = "".join(r.as_numpy("text_output")[0].decode() for r, _ in got)
    assert texts["tensorrt_llm_bls"] == texts["ensemble"] and texts["ensemble"]


def test_http_generate_on_the_bls_model(server):
    """Upstream's README: curl -X POST .../v2/models/tensorrt_llm_bls/generate -d '{"text_input": ..., ...}'."""
    import json
    import urllib.request

    body = json.dumps({"text_input": "Medusa heads", "max_tokens": 12, "bad_words": "", "stop_words": ""}).encode()
    for model in ("ensemble", "tensorrt_llm_bls"):
        request = urllib.request.Request(f"http://127.0.0.1:{server.options.http_port}/v2/models/{model}/generate",
                                         data=body, headers={"Content-Type": "application/json"})
        answer = json.loads(urllib.request.urlopen(request, timeout=60).read())
        assert answer["model_name"] == model and answer["text_output"].startswith("Medusa heads")


def test_a_stream_never_ends_a_response_inside_a_character(server, local):
    """Byte-level tokens split multi-byte characters. Streamed one token per response (use_speculation false), a
    character whose bytes are not all generated yet waits for the next response instead of going out as U+FFFD:
    every response decodes as strict UTF-8, as NVIDIA's clients decode each one (`[0].decode("utf-8")`), and the
    pieces join to the text of the whole reply. Cut there by max_tokens, the final response flushes the incomplete
    character (one U+FFFD), as decoding the whole reply does."""
    prompt = "Hello world"
    ids = local.generate(_raw(local, prompt), _options(60, no_spec=True)).output_ids
    decode, whole = local.tokenizer.decode, local.tokenizer.decode(ids)

    def incomplete(n):  # ids[:n] end inside a character that the later ids complete
        text = decode(ids[:n])
        return text.endswith("\ufffd") and whole.startswith(text[:-1]) and whole[len(text) - 1] != "\ufffd"

    cuts = [n for n in range(2, len(ids)) if incomplete(n)]
    assert cuts, "the tiny model's greedy reply splits no multi-byte character"
    for max_tokens in (len(ids), cuts[0]):
        got = stream_once(server.grpc_url, "ensemble", _request(
            prompt, max_tokens, stream=np.array([[True]], bool), temperature=np.array([[1.0]], np.float32),
            use_speculation=np.array([[False]], bool)))
        assert got and all(error is None for _, error in got)
        pieces = [result.as_numpy("text_output")[0].decode("utf-8") for result, _ in got]  # strict: raises if cut
        assert len(pieces) >= max_tokens  # one token per response: every split was a response boundary
        assert "".join(pieces) == decode(ids[:max_tokens])
        if max_tokens == len(ids):  # the split characters went out whole, once complete
            assert "".join(pieces).count("\ufffd") == whole.count("\ufffd")
        else:
            assert pieces[-1].endswith("\ufffd")  # the incomplete character, flushed by the final response
