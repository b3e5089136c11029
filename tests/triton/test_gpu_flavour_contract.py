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
from trtspec.triton.deploy import DeployOptions, deploy

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
    ids = got["OUTPUT_IDS"]  # beam 0's ids, [B, longest], -1 after a shorter item (trtspec's own output_ids)
    assert ids.shape == (batch, int(lengths[:, 0].max())) and ids[0, :7].tolist() == tokens[0, 0, :7].tolist()
    assert ids[0, 7:].tolist() == [-1] * (ids.shape[1] - 7)
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
