"""The GPU (TensorRT-LLM) flavour held to the wire contract the CPU flavour is tested against for real, without a
GPU: its configs (rendered by `deploy --flavour trtllm` for stand-in engines of three TensorRT-LLM versions) declare
every response tensor with the contract's type and dims, each produced by a step that declares it the same way, and
its own postprocessing model code (run against a `triton_python_backend_utils` stand-in) sends `text_output` 1-D,
batch x beams, as upstream's postprocessing does and as NVIDIA's clients read it (`as_numpy(name)[0].decode()`)."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from tests.trtllm.conftest import build_engine, write_config_checkpoint
from tests.trtllm.test_models import InferenceRequest, InferenceResponse, Request, Tensor, load_model
from trtspec.testing import write_tiny_tokenizer
from trtspec.triton import contract
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions

ENGINES = {"0.17.0": "vicuna-7b", "0.19.0": "vicuna-7b", "1.2.1": "vicuna-7b-medusa"}  # TensorRT-LLM version → model


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-flavour")
    write_tiny_tokenizer(root / "tokenizer")
    out = {}
    for version, name in ENGINES.items():
        checkpoint = write_config_checkpoint(root / f"ckpt-{version}", name, weights=True)
        build_engine(checkpoint, root / f"engine-{version}", root / "tokenizer", version=version)
        out[version] = deploy(DeployOptions(engine_dir=root / f"engine-{version}", out=root / f"repo-{version}"))
    return out


def _configs(repo) -> dict[str, dict]:
    parse = lambda path: json_format.MessageToDict(  # noqa: E731
        text_format.Parse(path.read_text(), model_config_pb2.ModelConfig()), preserving_proto_field_name=True)
    return {path.parent.name: parse(path) for path in repo.glob("*/config.pbtxt")}


def _declared(config, kind="output") -> dict[str, tuple[str, tuple[int, ...]]]:
    return {t["name"]: (t["data_type"], tuple(int(d) for d in t.get("dims", ()))) for t in config.get(kind, [])}


def _perf_metrics_expected(version: str) -> bool:
    return tuple(int(x) for x in version.split(".")[:2]) >= (0, 19)  # return_perf_metrics appeared in v0.19


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
@pytest.mark.parametrize("version", list(ENGINES))
def test_the_ensemble_declares_the_contracts_outputs_as_the_cpu_flavour_does(repos, version, model):
    """text_output, the log probs, batch / sequence index and (0.19+) upstream's ten perf metrics: same names, types
    and dims as the CPU flavour's ensemble, so a client parses both the same way (the BLS as upstream's BLS)."""
    outputs = _declared(_configs(repos[version])[model])
    cpu = {t.name: (t.data_type, t.dims) for t in contract.cpu_ensemble_outputs()}
    expected = list(contract.ENSEMBLE_OUTPUTS)
    if _perf_metrics_expected(version):
        expected += contract.PERF_METRIC_OUTPUTS
    for t in expected:
        assert outputs.get(t.name) == cpu[t.name] == (t.data_type, t.dims), t.name
    perf = {t.name for t in contract.PERF_METRIC_OUTPUTS}
    assert (perf <= set(outputs)) == _perf_metrics_expected(version)
    if _perf_metrics_expected(version):  # the switch end_to_end_grpc_client.py --return-perf-metrics sends
        assert _declared(_configs(repos[version])[model], "input")["return_perf_metrics"][0] == "TYPE_BOOL"


@pytest.mark.parametrize("version", list(ENGINES))
def test_every_ensemble_output_comes_from_a_step_that_declares_it_alike(repos, version):
    """Each ensemble output is some step's output (never left unproduced, which Triton only reports at request
    time) and that model declares it with the ensemble's type."""
    configs = _configs(repos[version])
    ensemble = configs["ensemble"]
    sources = {}
    for step in ensemble["ensemble_scheduling"]["step"]:
        for model_output, tensor in step.get("output_map", {}).items():
            sources[tensor] = (step["model_name"], model_output)
    for name, (data_type, _) in _declared(ensemble).items():
        assert name in sources, f"{name}: no step produces it"
        model, model_output = sources[name]
        assert _declared(configs[model])[model_output][0] == data_type, (name, model, model_output)


@pytest.mark.parametrize("batch,beams", [(1, 1), (3, 1), (1, 2)])
def test_postprocessing_sends_text_output_one_dimensional(repos, monkeypatch, batch, beams):
    """The GPU flavour's postprocessing model code: OUTPUT (text_output) is a 1-D array of batch x beams UTF-8 byte
    strings whatever its config's dims say, as upstream's postprocessing builds it (`np.array(outputs)` over a flat
    list); `[0].decode("utf-8")` reads the first, as end_to_end_grpc_client.py does."""
    _, post = load_model(repos["1.2.1"], "postprocessing", monkeypatch)
    rng = np.random.default_rng(batch * 10 + beams)
    tokens = rng.integers(3, 250, (batch, beams, 12)).astype(np.int32)
    lengths = np.full((batch, beams), 12, np.int32)
    lengths[0, 0] = 7  # a shorter item: its padding is not decoded
    (response,) = post.execute([Request([Tensor("TOKENS_BATCH", tokens), Tensor("SEQUENCE_LENGTH", lengths)])])
    assert not response.has_error(), response.error().message()
    got = {t.name(): t.as_numpy() for t in response.output_tensors()}
    text = got["OUTPUT"]
    assert text.shape == (batch * beams,) and text.dtype == object and all(isinstance(x, bytes) for x in text)
    expected = [post.tokenizer.decode(tokens[b, k, :lengths[b, k]].tolist(), skip_special_tokens=True)
                for b in range(batch) for k in range(beams)]  # batch-major, beams within an item
    assert [x.decode("utf-8") for x in text] == expected
    assert set(got) == {"OUTPUT"}  # as upstream's postprocessing: the ids reach the client from tensorrt_llm
    ensemble = _configs(repos["1.2.1"])["ensemble"]
    post_step = next(s for s in ensemble["ensemble_scheduling"]["step"] if s["model_name"] == "postprocessing")
    assert post_step["output_map"]["OUTPUT"] == "text_output"


def _engine_with_perf_metrics(request):
    """A stand-in tensorrt_llm: echoes the prompt's last 4 ids reversed; the ten perf metrics only when asked."""
    t = {k: v.as_numpy() for k, v in request.tensors.items()}
    ids = t["input_ids"][0, :int(t["input_lengths"].reshape(-1)[0])].tolist()[-4:][::-1]
    tensors = [Tensor("output_ids", np.array([[ids]], np.int32)), Tensor("sequence_length", np.array([[len(ids)]], np.int32))]
    if bool(t.get("return_perf_metrics", np.zeros(1, bool)).any()):
        dtypes = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}
        tensors += [Tensor(m.name, np.ones((1, 1), dtypes[m.data_type])) for m in contract.PERF_METRIC_OUTPUTS]
    return InferenceResponse(tensors)


@pytest.mark.parametrize("asked", [False, True])
def test_the_bls_passes_the_perf_metrics_on_only_when_asked(repos, monkeypatch, asked):
    """tensorrt_llm_bls (trtspec's code, 0.19+): with return_perf_metrics the engine's ten perf metrics reach the
    client under upstream's names and types, [1, 1] as `as_numpy(name)[0][0]` reads them; without, none is sent.
    text_output stays 1-D."""
    repo = repos["1.2.1"]
    _, pre = load_model(repo, "preprocessing", monkeypatch)
    _, post = load_model(repo, "postprocessing", monkeypatch)
    _, bls = load_model(repo, "tensorrt_llm_bls", monkeypatch)
    monkeypatch.setattr(InferenceRequest, "models", {
        "preprocessing": lambda r: pre.execute([r])[0], "postprocessing": lambda r: post.execute([r])[0],
        "tensorrt_llm": lambda r: [_engine_with_perf_metrics(r)] if bls.target_decoupled else _engine_with_perf_metrics(r)})
    monkeypatch.setattr(InferenceRequest, "calls", [])
    inputs = [Tensor("text_input", np.array([[b"Hello world"]], object)), Tensor("max_tokens", np.array([[4]], np.int32)),
              Tensor("return_perf_metrics", np.array([[asked]], bool))]
    responses = []
    if bls.decoupled:
        sent = []

        class Sender:
            def send(self, response=None, flags=0):
                if response is not None:
                    sent.append(response)

        request = Request(inputs)
        request.get_response_sender = lambda: Sender()
        assert bls.execute([request]) is None
        responses = sent
    else:
        responses = bls.execute([Request(inputs)])
    assert responses and not any(r.has_error() for r in responses), [r.error().message() for r in responses if r.has_error()]
    got = {t.name(): t.as_numpy() for t in responses[-1].output_tensors()}
    assert got["text_output"].ndim == 1 and isinstance(got["text_output"][0], bytes)
    dtypes = {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}
    for metric in contract.PERF_METRIC_OUTPUTS:
        if asked:
            assert got[metric.name].shape == (1, 1) and got[metric.name].dtype == dtypes[metric.data_type], metric.name
        else:
            assert metric.name not in got, metric.name


@pytest.mark.parametrize("cut", [False, True])
def test_the_bls_stream_never_ends_a_response_inside_a_character(repos, monkeypatch, cut):
    """tensorrt_llm_bls streaming (trtspec's code): the C++ engine sends each response's new tokens alone (here one
    byte-level token each, splitting every multi-byte character); every text_output decodes as strict UTF-8, a split
    character goes out whole once its bytes are there, and a reply cut inside one ends with a response flushing it
    (U+FFFD), so the pieces join to the text of the whole reply."""
    text = "café 東京 🙂 ok"
    repo = repos["1.2.1"]
    _, pre = load_model(repo, "preprocessing", monkeypatch)
    _, post = load_model(repo, "postprocessing", monkeypatch)
    _, bls = load_model(repo, "tensorrt_llm_bls", monkeypatch)
    ids = post.tokenizer.encode(text, add_special_tokens=False)
    assert post.tokenizer.decode(ids) == text and len(ids) > len(text)  # byte-level: characters span tokens
    if cut:
        ids = ids[:next(n for n in range(1, len(ids)) if post.tokenizer.decode(ids[:n]).endswith("\ufffd"))]

    def engine(request):  # streaming: one response per token, then the final empty one
        assert bool(request.tensors["streaming"].as_numpy().any())
        return [InferenceResponse([Tensor("output_ids", np.array([[[t]]], np.int32)),
                                   Tensor("sequence_length", np.array([[1]], np.int32))]) for t in ids] + [
            InferenceResponse([])]

    monkeypatch.setattr(InferenceRequest, "models", {
        "preprocessing": lambda r: pre.execute([r])[0], "postprocessing": lambda r: post.execute([r])[0],
        "tensorrt_llm": engine})
    monkeypatch.setattr(InferenceRequest, "calls", [])
    assert bls.decoupled and bls.target_decoupled
    sent = []

    class Sender:
        def send(self, response=None, flags=0):
            if response is not None:
                sent.append(response)

    request = Request([Tensor("text_input", np.array([[b"Hello"]], object)),
                       Tensor("max_tokens", np.array([[len(ids)]], np.int32)), Tensor("stream", np.array([[True]], bool))])
    request.get_response_sender = lambda: Sender()
    bls.execute([request])
    assert sent and not any(r.has_error() for r in sent)
    pieces = []
    for response in sent:
        out = {t.name(): t.as_numpy() for t in response.output_tensors()}
        assert out["text_output"].ndim == 1
        pieces.append(out["text_output"][0].decode("utf-8"))  # strict, as NVIDIA's clients decode
    assert "".join(pieces) == post.tokenizer.decode(ids)
    if cut:
        assert pieces[-1] == "\ufffd" and "\ufffd" not in "".join(pieces[:-1])
    else:
        assert "\ufffd" not in "".join(pieces) and any(p == "" for p in pieces)  # held back, then sent whole


NUMPY = {"TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_FP32": np.float32, "TYPE_BOOL": np.bool_,
         "TYPE_STRING": np.object_}


def _preprocess(pre, **tensors):
    (response,) = pre.execute([Request([Tensor(k, v) for k, v in tensors.items()])])
    return response


@pytest.mark.parametrize("version", list(ENGINES))
def test_preprocessing_sends_upstreams_decoder_outputs_and_embedding_bias(repos, monkeypatch, version):
    """The GPU flavour's preprocessing model code, run against its real config: DECODER_INPUT_ID (pad_id, [B, 1]) and
    REQUEST_DECODER_INPUT_LEN (1, [B, 1]) as upstream's preprocessing sends them for a decoder-only model (what
    end_to_end_test.py reads and hands to tensorrt_llm), and EMBEDDING_BIAS as upstream's builds it from the words and
    weights: [B, vocab] float32, each token of each word biased by the word's weight, [B, 0] without words. Every
    output in its declared type and rank."""
    repo = repos[version]
    _, pre = load_model(repo, "preprocessing", monkeypatch)
    config = _configs(repo)["preprocessing"]
    declared = _declared(config)
    vocab = int(config["parameters"]["vocab_size"]["string_value"])
    assert pre.vocab_size == vocab == 32000  # the engine's logits width, which TensorRT-LLM checks the bias against
    query = np.array([[b"Hello world"], [b"the quick brown fox"]], object)
    words = np.array([[b"fox", b"dog"], [b"cat", b""]], object)  # "" pads the second item's list
    weights = np.array([[2.0, -1.5], [0.5, 0.0]], np.float32)
    response = _preprocess(pre, QUERY=query, REQUEST_OUTPUT_LEN=np.array([[8], [8]], np.int32),
                           EMBEDDING_BIAS_WORDS=words, EMBEDDING_BIAS_WEIGHTS=weights,
                           PAD_ID=np.array([[5], [5]], np.int32))
    assert not response.has_error(), response.error().message()
    got = {t.name(): t.as_numpy() for t in response.output_tensors()}
    assert set(declared) - set(got) == {"OUT_PROMPT_TABLE_EXTRA_IDS"}  # only with PROMPT_TABLE_EXTRA_ID, as upstream's
    for name, array in got.items():
        data_type, dims = declared[name]
        assert array.dtype == NUMPY[data_type] and array.ndim == len(dims) + 1 and array.shape[0] == 2, name
    assert got["DECODER_INPUT_ID"].tolist() == [[5], [5]] == got["OUT_PAD_ID"].tolist()
    assert got["REQUEST_DECODER_INPUT_LEN"].tolist() == [[1], [1]]
    expected = np.zeros((2, vocab), np.float32)
    for b, row in enumerate(words):
        for word, weight in zip(row, weights[b]):
            if word:
                np.add.at(expected[b], pre.tokenizer.encode(word.decode(), add_special_tokens=False), weight)
    assert got["EMBEDDING_BIAS"].shape == (2, vocab) and np.array_equal(got["EMBEDDING_BIAS"], expected)
    assert expected[0].any() and expected[1].any() and not got["EMBEDDING_BIAS"][:, 1].any()  # no BOS bias

    plain = _preprocess(pre, QUERY=query[:1], REQUEST_OUTPUT_LEN=np.array([[8]], np.int32))
    plain = {t.name(): t.as_numpy() for t in plain.output_tensors()}
    assert plain["EMBEDDING_BIAS"].shape == (1, 0) and plain["EMBEDDING_BIAS"].dtype == np.float32
    assert plain["DECODER_INPUT_ID"].tolist() == plain["OUT_PAD_ID"].tolist() and plain["OUT_PAD_ID"].shape == (1, 1)

    extra = _preprocess(pre, QUERY=query[:1], REQUEST_OUTPUT_LEN=np.array([[8]], np.int32),
                        PROMPT_TABLE_EXTRA_ID=np.array([[9]], np.uint64))
    extra = {t.name(): t.as_numpy() for t in extra.output_tensors()}
    ids = extra["OUT_PROMPT_TABLE_EXTRA_IDS"]  # 0 at ordinary tokens: this prompt has no prompt-table ids
    assert ids.dtype == np.uint64 and ids.shape == extra["INPUT_ID"].shape and not ids.any()


@pytest.mark.parametrize("tensors,message", [
    ({"EMBEDDING_BIAS_WORDS": np.array([[b"fox"]], object)},
     "embedding_bias_words was sent without embedding_bias_weights; send both, one weight per word"),
    ({"EMBEDDING_BIAS_WEIGHTS": np.array([[1.0]], np.float32)},
     "embedding_bias_weights was sent without embedding_bias_words; send both, one weight per word"),
    ({"EMBEDDING_BIAS_WORDS": np.array([[b"fox", b"dog"]], object), "EMBEDDING_BIAS_WEIGHTS": np.array([[1.0]], np.float32)},
     "embedding_bias_words has 2 words and embedding_bias_weights 1 weights; they must match one to one"),
    ({"DECODER_QUERY": np.array([[b"Bonjour"]], object)},
     "decoder_text_input is for encoder-decoder models; this engine is decoder-only, send the prompt as text_input"),
])
def test_preprocessing_refuses_in_one_line(repos, monkeypatch, tensors, message):
    _, pre = load_model(repos["1.2.1"], "preprocessing", monkeypatch)
    response = _preprocess(pre, QUERY=np.array([[b"Hello"]], object), REQUEST_OUTPUT_LEN=np.array([[4]], np.int32),
                           **tensors)
    assert response.has_error() and response.error().message() == message


def _run_ensemble(repo, monkeypatch, client, engine):
    """The ensemble's steps as its config wires them (Triton's ensemble scheduler in miniature): each step's request
    from its input_map, its response into the pool through its output_map."""
    _, pre = load_model(repo, "preprocessing", monkeypatch)
    _, post = load_model(repo, "postprocessing", monkeypatch)
    models = {"preprocessing": lambda r: pre.execute([r])[0], "postprocessing": lambda r: post.execute([r])[0],
              "tensorrt_llm": engine}
    configs = _configs(repo)
    pool = dict(client)
    for step in configs["ensemble"]["ensemble_scheduling"]["step"]:
        declared = _declared(configs[step["model_name"]], "input")
        inputs = {key: pool[value] for key, value in step["input_map"].items() if value in pool}
        for key, array in inputs.items():  # what Triton would check: type and rank
            data_type, dims = declared[key]
            assert np.asarray(array).dtype == NUMPY[data_type] and np.asarray(array).ndim == len(dims) + 1, key
        response = models[step["model_name"]](Request([Tensor(k, v) for k, v in inputs.items()]))
        assert not response.has_error(), response.error().message()
        got = {t.name(): t.as_numpy() for t in response.output_tensors()}
        pool.update({value: got[key] for key, value in step["output_map"].items() if key in got})
    return pool


@pytest.mark.parametrize("version", list(ENGINES))
def test_the_ensemble_hands_upstreams_extra_inputs_to_tensorrt_llm(repos, monkeypatch, version):
    """Through the ensemble's wiring, as upstream's: the embedding bias words / weights arrive at tensorrt_llm as
    `embedding_bias` [1, vocab], the decoder inputs as upstream's preprocessing makes them, LoRA (and from 0.19 guided
    decoding) as the client sent them, for the C++ backend to honour; output_ids reaches the client as tensorrt_llm
    sends it, [1, beams, L], as the CPU flavour's does, and text_output 1-D."""
    seen = {}

    def engine(request):
        seen.update({k: v.as_numpy() for k, v in request.tensors.items()})
        return InferenceResponse([Tensor("output_ids", np.array([[[40, 41, 42]]], np.int32)),
                                  Tensor("sequence_length", np.array([[3]], np.int32))])

    client = {"text_input": np.array([[b"Hello world"]], object), "max_tokens": np.array([[3]], np.int32),
              "embedding_bias_words": np.array([[b"fox"]], object),
              "embedding_bias_weights": np.array([[2.0]], np.float32), "lora_task_id": np.array([[3]], np.uint64),
              "guided_decoding_guide_type": np.array([[b"json"]], object)}
    guided = _perf_metrics_expected(version)  # guided decoding came with the same release, 0.19
    if not guided:
        del client["guided_decoding_guide_type"]
    assert set(client) <= set(_declared(_configs(repos[version])["ensemble"], "input"))
    pool = _run_ensemble(repos[version], monkeypatch, client, engine)
    assert seen["embedding_bias"].shape == (1, 32000) and seen["embedding_bias"].max() == 2.0
    assert seen["decoder_input_ids"].tolist() == seen["pad_id"].tolist() and seen["decoder_input_lengths"].tolist() == [[1]]
    assert seen["lora_task_id"].tolist() == [[3]]
    assert (seen.get("guided_decoding_guide_type") is not None) == guided
    assert "prompt_table_extra_ids" not in seen  # only with prompt_table_extra_id, as upstream's preprocessing
    assert pool["output_ids"].shape == (1, 1, 3) and pool["output_ids"].tolist() == [[[40, 41, 42]]]
    assert pool["text_output"].ndim == 1 and isinstance(pool["text_output"][0], bytes)
    ensemble = _declared(_configs(repos[version])["ensemble"])
    cpu = {t.name: (t.data_type, t.dims) for t in contract.cpu_ensemble_outputs()}
    assert ensemble["output_ids"] == cpu["output_ids"] == ("TYPE_INT32", (-1, -1))
