"""The GPU repository's Python-backend models (trtspec's own sources), run against a stand-in for
`triton_python_backend_utils` and stand-in engine models: the real tokenizer models and the BLS draft-target loop,
which must emit exactly the target's greedy tokens (lossless) whatever the draft proposes."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions

VOCAB = 300  # below the tiny tokenizer's vocabulary, so every id decodes
END_ID = 2


# ---- a stand-in for triton_python_backend_utils ---------------------------------------------------------

class Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class TritonError:
    def __init__(self, message):
        self._message = message

    def message(self):
        return self._message


class InferenceResponse:
    def __init__(self, output_tensors, error=None):
        self._tensors, self._error = list(output_tensors), error

    def output_tensors(self):
        return self._tensors

    def has_error(self):
        return self._error is not None

    def error(self):
        return self._error


class Request:
    def __init__(self, tensors):
        self.tensors = {t.name(): t for t in tensors}


class InferenceRequest(Request):
    models: dict = {}  # model name → callable(Request) → InferenceResponse or a list of them (decoupled)
    calls: list = []

    def __init__(self, model_name, inputs, requested_output_names):
        super().__init__(inputs)
        self.model_name = model_name

    def exec(self, decoupled=False):
        InferenceRequest.calls.append((self.model_name, {k: t.as_numpy() for k, t in self.tensors.items()}))
        result = InferenceRequest.models[self.model_name](self)
        return iter(result) if decoupled else result


def stub_module() -> types.ModuleType:
    pb = types.ModuleType("triton_python_backend_utils")
    pb.Tensor, pb.TritonError, pb.InferenceResponse, pb.InferenceRequest = (Tensor, TritonError, InferenceResponse,
                                                                            InferenceRequest)
    pb.get_input_tensor_by_name = lambda request, name: request.tensors.get(name)
    pb.get_output_tensor_by_name = lambda response, name: next(
        (t for t in response.output_tensors() if t.name() == name), None)
    pb.using_decoupled_model_transaction_policy = lambda config: bool(
        config.get("model_transaction_policy", {}).get("decoupled", False))
    pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
    return pb


def load_model(repo, name, monkeypatch):
    """Import REPO/name/1/model.py and initialize it with its config.pbtxt as Triton passes it (JSON)."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", stub_module())
    spec = importlib.util.spec_from_file_location(f"model_{name}", repo / name / "1" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    model = module.TritonPythonModel()
    model.initialize({"model_config": json_format.MessageToJson(config, preserving_proto_field_name=True)})
    return module, model


# ---- stand-in engines: greedy next token = f(sequence) -------------------------------------------------

def target_next(seq):
    return 3 + (sum(seq) * 7 + len(seq)) % (VOCAB - 3)


def draft_next(seq):
    return target_next(seq) if len(seq) % 4 else 5  # wrong every fourth position


def engine(next_token):
    def run(request):
        t = {k: v.as_numpy() for k, v in request.tensors.items()}
        seq = t["input_ids"][0, :int(t["input_lengths"].reshape(-1)[0])].tolist()
        draft = t["draft_input_ids"][0].tolist() if "draft_input_ids" in t else None
        out = []
        for _ in range(int(t["request_output_len"].reshape(-1)[0])):
            token = next_token(seq + out)
            out.append(token)
            if token == END_ID or draft is not None and (len(out) > len(draft) or token != draft[len(out) - 1]):
                break  # external draft tokens: accepted prefix plus one token of the target's own
        if not bool(t.get("exclude_input_in_output", np.array([False])).reshape(-1)[0]):
            out = seq + out
        return InferenceResponse([Tensor("output_ids", np.array([[out]], np.int32)),
                                  Tensor("sequence_length", np.array([[len(out)]], np.int32))])
    return run


def greedy(prompt, n):
    seq = list(prompt)
    for _ in range(n):
        seq.append(target_next(seq))
    return seq[len(prompt):]


# ---- the tests ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def repo(checkpoints, tokenizer_dir, tmp_path_factory, engine_builder):
    root = tmp_path_factory.mktemp("models")
    engine_builder(checkpoints["llama-3.1-8b"], root / "target", tokenizer_dir, draft_target=True, max_draft_len=6)
    engine_builder(checkpoints["llama-3.2-1b"], root / "draft", tokenizer_dir)
    return deploy(DeployOptions(engine_dir=root / "target", out=root / "repo", draft_engine_dir=root / "draft",
                                chat_template=False))


@pytest.fixture
def server(repo, monkeypatch):
    """The repository's Python models wired to stand-in engines; returns the BLS model."""
    _, pre = load_model(repo, "preprocessing", monkeypatch)
    _, post = load_model(repo, "postprocessing", monkeypatch)
    bls_module, bls = load_model(repo, "tensorrt_llm_bls", monkeypatch)
    InferenceRequest.calls = []
    InferenceRequest.models = {"preprocessing": lambda r: pre.execute([r])[0],
                               "postprocessing": lambda r: post.execute([r])[0],
                               "tensorrt_llm": engine(target_next), "tensorrt_llm_draft": engine(draft_next)}
    return bls_module, bls, pre


def ask(bls, **tensors):
    request = Request([Tensor(k, v) for k, v in tensors.items()])
    (response,) = bls.execute([request])
    return response


def out(response, name):
    return next(t.as_numpy() for t in response.output_tensors() if t.name() == name)


def test_preprocessing_word_lists_and_ids(server):
    _, _, pre = server
    response = pre.execute([Request([Tensor("QUERY", np.array([[b"Hello world"]], object)),
                                     Tensor("REQUEST_OUTPUT_LEN", np.array([[8]], np.int32)),
                                     Tensor("STOP_WORDS_DICT", np.array([[b"fox", b"dog"]], object))])])[0]
    tensors = {t.name(): t.as_numpy() for t in response.output_tensors()}
    assert tensors["INPUT_ID"].shape[1] == tensors["REQUEST_INPUT_LEN"][0, 0] and tensors["INPUT_ID"][0, 0] == 1
    stop = tensors["STOP_WORDS_IDS"]  # [B, 2, L]: concatenated ids (0-padded); end offsets (-1-padded)
    offsets = [o for o in stop[0, 1].tolist() if o >= 0]
    assert len(offsets) == 2 and 0 < offsets[0] < offsets[1] and stop.shape == (1, 2, max(offsets[1], 2))
    assert (stop[0, 0, offsets[1]:] == 0).all() and (stop[0, 0, :offsets[1]] > 0).all()
    assert tensors["BAD_WORDS_IDS"].shape == (1, 2, 0)
    assert (tensors["OUT_END_ID"][0, 0], tensors["REQUEST_OUTPUT_LEN"][0, 0]) == (END_ID, 8)


@pytest.mark.parametrize("num_draft", [1, 3, 6])
def test_draft_target_loop_is_lossless(server, num_draft):
    bls_module, bls, _ = server
    response = ask(bls, text_input=np.array([[b"Speculative decoding"]], object),
                   max_tokens=np.array([[20]], np.int32), num_draft_tokens=np.array([[num_draft]], np.int32),
                   exclude_input_in_output=np.array([[True]], bool))
    assert not response.has_error(), response.error().message()
    prompt = InferenceRequest.calls[1][1]["input_ids"][0].tolist()  # the first engine call carries the prompt
    ids = out(response, "output_ids")[0, 0].tolist()  # [1, beams, L], as tensorrt_llm sends it
    assert ids == greedy(prompt, 20)[:len(ids)] and len(ids) == 20  # exactly the target's greedy tokens
    steps, accepted = int(out(response, "num_verify_steps")[0, 0]), int(out(response, "num_accepted_tokens")[0, 0])
    drafted = int(out(response, "total_draft_tokens")[0, 0])
    assert steps + accepted == 20 and 0 < accepted <= drafted  # every step emits its accepted drafts + 1
    assert steps < 20  # the draft is right 3 times in 4: fewer target calls than tokens
    targets = [c for c in InferenceRequest.calls if c[0] == "tensorrt_llm"]
    assert all(len(c[1]["draft_input_ids"][0]) <= num_draft for c in targets)
    assert out(response, "text_output").ndim == 1 and isinstance(out(response, "text_output")[0], bytes)


def test_speculative_loop_stops_at_end_id(server):
    bls_module, _, _ = server
    result = bls_module.speculative_loop([1], 10, 3, lambda s, k: [7] * k, lambda s, d: d[:1] + [END_ID], END_ID)
    assert (result.tokens, result.accepted, result.steps) == ([7], 1, 1)


@pytest.mark.parametrize("tensors,message", [
    ({"num_draft_tokens": np.array([[7]], np.int32)}, "num_draft_tokens 7 exceeds the target engine's max_draft_len 6"),
    ({"num_draft_tokens": np.array([[2]], np.int32), "stream": np.array([[True]], bool)},
     "Streaming is only supported if model is deployed using decoupled mode"),
    ({"num_draft_tokens": np.array([[2]], np.int32), "use_draft_logits": np.array([[True]], bool)},
     "use_draft_logits is not supported"),
    ({"num_draft_tokens": np.array([[2]], np.int32), "beam_width": np.array([[2]], np.int32)},
     "does not support beam search"),
])
def test_bls_rejects_what_the_loop_cannot_do(server, tensors, message):
    _, bls, _ = server
    response = ask(bls, text_input=np.array([[b"hi"]], object), max_tokens=np.array([[4]], np.int32), **tensors)
    assert response.has_error() and message in response.error().message()


def test_plain_request_passes_through(server):
    _, bls, _ = server
    response = ask(bls, text_input=np.array([[b"hi"]], object), max_tokens=np.array([[5]], np.int32),
                   top_k=np.array([[1]], np.int32), exclude_input_in_output=np.array([[True]], bool))
    assert not response.has_error(), response.error().message()
    target = next(c[1] for c in InferenceRequest.calls if c[0] == "tensorrt_llm")
    assert "runtime_top_k" in target and "top_k" not in target and "draft_input_ids" not in target
    assert out(response, "output_ids").shape == (1, 1, 5)
    assert out(response, "text_output").ndim == 1 and isinstance(out(response, "text_output")[0], bytes)


def test_bls_passes_upstreams_extra_inputs_on(server):
    """Upstream's BLS inputs beyond the contract's first table reach the engines as upstream's wiring hands them on:
    the embedding bias (built by preprocessing, [1, vocab]) to both models of the draft-target pair, LoRA to the
    target only (the draft is a plain engine; the target verifies every token either way)."""
    _, bls, pre = server
    response = ask(bls, text_input=np.array([[b"Speculative decoding"]], object), max_tokens=np.array([[6]], np.int32),
                   num_draft_tokens=np.array([[2]], np.int32), exclude_input_in_output=np.array([[True]], bool),
                   embedding_bias_words=np.array([[b"fox"]], object),
                   embedding_bias_weights=np.array([[1.5]], np.float32), lora_task_id=np.array([[7]], np.uint64))
    assert not response.has_error(), response.error().message()
    targets = [c[1] for c in InferenceRequest.calls if c[0] == "tensorrt_llm"]
    drafts = [c[1] for c in InferenceRequest.calls if c[0] == "tensorrt_llm_draft"]
    assert targets and drafts
    assert all(c["lora_task_id"].reshape(-1).tolist() == [7] for c in targets)
    assert not any("lora_task_id" in c for c in drafts)
    bias = targets[0]["embedding_bias"]
    fox = pre.tokenizer.encode("fox", add_special_tokens=False)
    assert bias.shape == (1, pre.vocab_size) and bias.dtype == np.float32
    assert sorted(np.flatnonzero(bias[0]).tolist()) == sorted(set(fox)) and bias[0, fox[0]] >= 1.5
    assert all(np.array_equal(c["embedding_bias"], bias) for c in targets + drafts)


def test_bls_refuses_a_half_sent_embedding_bias_in_one_line(server):
    _, bls, _ = server
    response = ask(bls, text_input=np.array([[b"hi"]], object), max_tokens=np.array([[4]], np.int32),
                   embedding_bias_words=np.array([[b"fox"]], object))
    assert response.has_error()
    assert response.error().message() == ("embedding_bias_words was sent without embedding_bias_weights; send both, "
                                          "one weight per word")
