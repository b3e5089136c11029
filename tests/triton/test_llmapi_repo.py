"""`deploy --flavour llmapi`: the files for each version and decoding type, the version table held to upstream's
text (tests/triton/upstream/), the refused fields, the drafter checks, the CLI's one-line errors, and trtspec's
model.py run against stand-ins for `triton_python_backend_utils` and `tensorrt_llm`."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trtspec.cli import cli
from trtspec.errors import ConfigError, RepositoryError
from trtspec.testing.factory import TinyModel, write_eagle3_draft, write_hf_base
from trtspec.triton.deploy_options import LlmapiOptions
from trtspec.triton.llmapi_check import check_drafter
from trtspec.triton.llmapi_repo import deploy_llmapi
from trtspec.triton.llmapi_versions import KV_CACHE, TOP_LEVEL, TRITON_CONFIG, VERSIONS, parse_llmapi_version

UPSTREAM = Path(__file__).parent / "upstream"
SIGNATURES = {(1, 3): UPSTREAM / "trtllm-1.3.0rc27-decoding-configs.txt",
              (1, 4): UPSTREAM / "trtllm-1.4.0rc4-decoding-configs.txt"}
CLASSES = {"Eagle3": "Eagle3DecodingConfig", "MTP": "MTPDecodingConfig", "NGram": "NGramDecodingConfig"}
MODEL = TinyModel()


def upstream_fields(path: Path) -> dict[str, list[str]]:
    """class name → the field names its signature excerpt lists, in order."""
    out, current = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            continue
        match = re.match(r"class tensorrt_llm\.llmapi\.(\w+)\(", line)
        if match:
            current = out.setdefault(match[1], [])
        elif line.startswith(")"):
            current = None
        elif current is not None and re.match(r"^(\w+):", line):
            current.append(line.split(":")[0])
    return out


def parse_pbtxt(path: Path) -> dict:
    text = "\n".join(l for l in path.read_text().splitlines() if not l.startswith("#"))
    message = text_format.Parse(text, model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi")
    base = write_hf_base(root / "base", MODEL)
    mtp_base = write_hf_base(root / "mtp-base", MODEL)
    config = json.loads((mtp_base / "config.json").read_text())
    (mtp_base / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    eagle3 = write_eagle3_draft(root / "eagle3", MODEL, draft_vocab_size=128)
    draft = write_hf_base(root / "draft", TinyModel(hidden_size=32, num_layers=1))
    return {"base": base, "mtp-base": mtp_base, "eagle3": eagle3, "draft": draft, "root": root}


def deploy(folders, tmp_path, drafter=None, name="repo", **kwargs):
    draft = {"eagle3": folders["eagle3"], "draft_target": folders["draft"]}.get(drafter)
    base = folders["mtp-base"] if drafter == "mtp" else folders["base"]
    return deploy_llmapi(LlmapiOptions(hf_dir=base, out=tmp_path / name, drafter=drafter, draft_dir=draft, **kwargs))


def model_yaml(repo: Path) -> dict:
    return yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())


# ---- the version table against upstream's text ----------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(VERSIONS))
def test_each_versions_fields_are_upstreams(key):
    """Each class's list is exactly its upstream signature's fields; DraftTarget's are the DecodingBaseConfig
    fields every class of that version lists first (its own page was not read)."""
    upstream = upstream_fields(SIGNATURES[key])
    version = VERSIONS[key]
    for decoding_type, fields in version.decoding.items():
        if decoding_type == "DraftTarget":
            bases = {tuple(f[:f.index("enable_penalty") + 1]) for f in upstream.values()}
            assert len(bases) == 1, bases  # every class lists the same DecodingBaseConfig fields first
            assert set(fields) == set(bases.pop()) | {"decoding_type"}
            continue
        assert set(fields) == set(upstream[CLASSES[decoding_type]]), decoding_type
        assert f"decoding_type: Literal['{decoding_type}']" in SIGNATURES[key].read_text()
    assert set(version.decoding) - {"DraftTarget"} == {t for t, c in CLASSES.items() if c in upstream}


def test_top_level_keys_are_upstreams():
    text = (UPSTREAM / "trtllm-llmargs-top-level.txt").read_text()
    for key in TOP_LEVEL:
        assert re.search(rf"^\s*{key}:|\"{key}\"|\b{key}\b", text, re.M), key
    for key in KV_CACHE:
        assert re.search(rf"^\s+{key}: ", text, re.M), key
    sample = yaml.safe_load(text.split("all_models/llmapi/tensorrt_llm/1/model.yaml]")[1])
    assert set(sample["triton_config"]) == set(TRITON_CONFIG) and sample["triton_config"]["max_batch_size"] == 0
    assert sample["backend"] == "pytorch"


def test_versions_parse_and_refuse():
    assert parse_llmapi_version(None).short == "1.4"
    assert parse_llmapi_version("1.3.0rc29").held_to == "1.3.0rc27"
    with pytest.raises(ConfigError, match="1.3, 1.4"):
        parse_llmapi_version("1.2.1")
    with pytest.raises(ConfigError, match="not a version"):
        parse_llmapi_version("latest")


# ---- the files -------------------------------------------------------------------------------------------------

def test_config_pbtxt_is_upstreams(folders, tmp_path):
    """Same name, backend, instance group and tensors as upstream's v0.19.0 config.pbtxt; no max_batch_size."""
    repo = deploy(folders, tmp_path)
    ours = parse_pbtxt(repo / "tensorrt_llm" / "config.pbtxt")
    theirs = parse_pbtxt(UPSTREAM / "tensorrtllm_backend-v0.19.0-llmapi-config.pbtxt")
    assert ours == theirs
    assert "max_batch_size" not in (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*") if p.is_file()) == \
        ["tensorrt_llm/1/model.py", "tensorrt_llm/1/model.yaml", "tensorrt_llm/config.pbtxt"]


CASES = {"eagle3": {"decoding_type": "Eagle3", "max_draft_len": 3, "speculative_model": "EAGLE3"},
         "mtp": {"decoding_type": "MTP", "num_nextn_predict_layers": 1},
         "ngram": {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 3, "is_keep_all": True,
                   "is_use_oldest": True, "is_public_pool": True},
         "draft_target": {"decoding_type": "DraftTarget", "max_draft_len": 3, "speculative_model": "DRAFT"}}


@pytest.mark.parametrize("version", ["1.3", "1.4"])
@pytest.mark.parametrize("drafter", [None, *CASES])
def test_model_yaml_for_each_version_and_drafter(folders, tmp_path, version, drafter):
    if version == "1.3" and drafter == "ngram":
        with pytest.raises(ConfigError, match=r"TensorRT-LLM 1.3 .*no NGram field list.*--trtllm-version 1.4"):
            deploy(folders, tmp_path, drafter, trtllm_version=version)
        return
    repo = deploy(folders, tmp_path, drafter, trtllm_version=version)
    doc = model_yaml(repo)
    base = folders["mtp-base"] if drafter == "mtp" else folders["base"]
    assert doc["model"] == str(base.resolve()) and doc["backend"] == "pytorch"
    assert doc["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert doc["kv_cache_config"] == {"free_gpu_memory_fraction": 0.9, "enable_block_reuse": True}
    assert (doc["max_batch_size"], doc["max_num_tokens"]) == (64, 8192)
    args = {k: v for k, v in doc.items() if k != "triton_config"}  # what model.py hands LLM(**args)
    assert set(args) <= set(TOP_LEVEL) and set(args["kv_cache_config"]) <= set(KV_CACHE)
    if drafter is None:
        assert "speculative_config" not in doc
        return
    spec = doc["speculative_config"]
    paths = {"EAGLE3": str(folders["eagle3"].resolve()), "DRAFT": str(folders["draft"].resolve())}
    assert spec == {k: paths.get(v, v) if isinstance(v, str) else v for k, v in CASES[drafter].items()}
    upstream = upstream_fields(SIGNATURES[parse_llmapi_version(version).major, parse_llmapi_version(version).minor])
    accepted = VERSIONS[1, int(version[-1])].fields(spec["decoding_type"])
    assert set(spec) <= set(accepted)
    if spec["decoding_type"] != "DraftTarget":
        assert set(spec) <= set(upstream[CLASSES[spec["decoding_type"]]])


def test_options_reach_model_yaml(folders, tmp_path):
    repo = deploy(folders, tmp_path, "eagle3", max_draft_len=5, dynamic_tree_top_k=4, max_total_draft_tokens=20,
                  max_concurrency=8, max_batch_size=16, max_num_tokens=4096, kv_cache_free_gpu_mem_fraction=0.5,
                  kv_cache_reuse=False, decoupled=False, model_path="/models/base", draft_path="/models/eagle3",
                  speculative_options=("eagle3_model_arch=llama3", "draft_len_schedule={4: 3, 1: 5}"))
    doc = model_yaml(repo)
    assert doc["model"] == "/models/base" and doc["triton_config"]["decoupled"] is False
    assert doc["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": False}
    assert doc["speculative_config"] == {
        "decoding_type": "Eagle3", "max_draft_len": 5, "speculative_model": "/models/eagle3", "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 4, "max_total_draft_tokens": 20, "max_concurrency": 8,
        "eagle3_model_arch": "llama3", "draft_len_schedule": {1: 5, 4: 3}}


# ---- refused fields and options ------------------------------------------------------------------------------

@pytest.mark.parametrize("version,option,field", [
    ("1.4", "eagle_choices=[[0], [0, 0]]", "eagle_choices"),  # 1.3 has it, 1.4 does not
    ("1.3", "eagle3_one_model=true", "eagle3_one_model"),  # the 1.0-1.2 name; neither held version has it
    ("1.3", "spec_dec_variant=3", "spec_dec_variant"),  # 1.4 only
    ("1.4", "speculative_model_dir=/x", "speculative_model_dir"),
])
def test_a_field_the_version_lacks_is_refused(folders, tmp_path, version, option, field):
    with pytest.raises(ConfigError) as e:
        deploy(folders, tmp_path, "eagle3", trtllm_version=version, speculative_options=(option,))
    message = str(e.value)
    assert f"TensorRT-LLM {version}" in message and f"'{field}'" in message and "\n" not in message
    assert not (tmp_path / "repo").exists()


def test_eagle_choices_is_written_for_13(folders, tmp_path):
    repo = deploy(folders, tmp_path, "eagle3", trtllm_version="1.3", speculative_options=("eagle_choices=[[0]]",))
    assert model_yaml(repo)["speculative_config"]["eagle_choices"] == [[0]]


@pytest.mark.parametrize("kwargs,match", [
    ({"drafter": "eagle3"}, "--eagle3 needs"),
    ({"drafter": "ngram", "dynamic_tree_top_k": 4}, "--dynamic-tree applies"),
    ({"max_draft_len": 4}, "need a drafter"),
    ({"max_num_tokens": 8, "max_batch_size": 16}, "below --max-batch-size"),
    ({"kv_cache_free_gpu_mem_fraction": 1.5}, r"\(0, 1\]"),
    ({"drafter": "ngram", "speculative_options": ("nokey",)}, "KEY=VALUE"),
    ({"drafter": "ngram", "speculative_options": ("max_draft_len=4",)}, "writes it from its own option"),
    ({"draft_len_schedule": ((1, 3),)}, "need a drafter"),
    ({"drafter": "ngram", "draft_len_schedule": ((4, 2),)}, r"needs an entry for batch size 1 equal to "
                                                              r"max_draft_len \(3\); add 1:3"),
    ({"drafter": "ngram", "max_draft_len": 4, "draft_len_schedule": ((1, 3),)},
     r"batch size 1 drafts 3, but TensorRT-LLM needs it equal to max_draft_len \(4\)"),
    ({"drafter": "ngram", "max_draft_len": 4, "draft_len_schedule": ((1, 4), (2, 5))},
     r"draft length 5 \(batch size 2\) must be in 0..4"),
    ({"drafter": "ngram", "speculative_options": ("draft_len_schedule={4: 2}",)}, "needs an entry for batch size 1"),
    ({"drafter": "ngram", "speculative_options": ("draft_len_schedule=[1, 2]",)}, "must map batch sizes"),
])
def test_bad_options_are_one_line(folders, tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match) as e:
        deploy_llmapi(LlmapiOptions(hf_dir=folders["base"], out=tmp_path / "repo", **kwargs))
    assert "\n" not in str(e.value)


# ---- the drafter checks -------------------------------------------------------------------------------------

def test_matching_drafters_pass(folders):
    assert check_drafter(folders["base"], "eagle3", folders["eagle3"]) == []
    assert check_drafter(folders["mtp-base"], "mtp") == []
    assert check_drafter(folders["base"], "ngram") == []


def test_eagle3_mismatches_one_line_each(folders, tmp_path):
    base = write_hf_base(tmp_path / "wide", TinyModel(hidden_size=128, vocab_size=300))
    lines = check_drafter(base, "eagle3", folders["eagle3"])
    assert len(lines) == 2
    assert "hidden_size 64 differs from the base's hidden_size 128" in lines[0]
    assert "vocab_size 256 differs from the base's vocab_size 300" in lines[1]


def test_reduced_vocab_without_d2t(folders, tmp_path):
    from safetensors.torch import load_file, save_file

    draft = write_eagle3_draft(tmp_path / "eagle3", MODEL, draft_vocab_size=128)
    state = load_file(draft / "model.safetensors")
    del state["d2t"]
    save_file(state, str(draft / "model.safetensors"), metadata={"format": "pt"})
    lines = check_drafter(folders["base"], "eagle3", draft)
    assert len(lines) == 1 and "draft_vocab_size 128 < vocab_size 256" in lines[0] and "d2t" in lines[0]


def test_mtp_base_without_layers(folders):
    lines = check_drafter(folders["base"], "mtp")
    assert len(lines) == 1 and "num_nextn_predict_layers" in lines[0]


def test_draft_model_vocab(folders, tmp_path):
    other = write_hf_base(tmp_path / "other", TinyModel(vocab_size=300))
    lines = check_drafter(folders["base"], "draft_target", other)
    assert len(lines) == 1 and "vocab_size 300 differs" in lines[0]


def test_deploy_refuses_a_mismatched_draft_in_one_line(folders, tmp_path):
    base = write_hf_base(tmp_path / "wide", TinyModel(hidden_size=128, vocab_size=300))
    with pytest.raises(RepositoryError) as e:
        deploy_llmapi(LlmapiOptions(hf_dir=base, out=tmp_path / "repo", drafter="eagle3", draft_dir=folders["eagle3"]))
    assert "hidden_size" in str(e.value) and "vocab_size" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "repo").exists()


# ---- the CLI -------------------------------------------------------------------------------------------------

def run(*args):
    return CliRunner().invoke(cli, ["deploy", *map(str, args)])


def test_cli_writes_the_repository(folders, tmp_path):
    result = run("--flavour", "llmapi", "--hf", folders["base"], "--eagle3", folders["eagle3"], "--out",
                 tmp_path / "repo", "--max-draft-len", "4", "--trtllm-version", "1.3")
    assert result.exit_code == 0, result.output
    assert model_yaml(tmp_path / "repo")["speculative_config"]["max_draft_len"] == 4


@pytest.mark.parametrize("args,match", [
    (["--flavour", "llmapi", "--out", "R"], "needs --hf"),
    (["--flavour", "llmapi", "--hf", "BASE", "--mtp", "--ngram", "--out", "R"], "at most one of"),
    (["--flavour", "llmapi", "--hf", "BASE", "--copy-engine", "--out", "R"], "--copy-engine applies to the engine"),
    (["--hf", "BASE", "--out", "R"], "--hf applies to --flavour llmapi only"),
    (["--out", "R"], "missing argument ENGINE"),
    (["--flavour", "llmapi", "--hf", "BASE", "--mtp", "--out", "R"], "declares none"),
    (["--flavour", "llmapi", "--hf", "BASE", "--eagle3", "EAGLE3", "--trtllm-version", "1.4",
      "--speculative-option", "eagle_choices=[[0]]", "--out", "R"], "has no Eagle3 speculative_config field"),
    (["--flavour", "llmapi", "--hf", "BASE", "--trtllm-version", "1.1", "--out", "R"], "1.3, 1.4"),
])
def test_cli_errors_are_one_line(folders, tmp_path, args, match):
    subst = {"BASE": folders["base"], "EAGLE3": folders["eagle3"], "R": tmp_path / "repo"}
    result = run(*[subst.get(a, a) for a in args])
    assert result.exit_code != 0
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert "Traceback" not in result.output
    assert re.search(match, result.output), result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output


def test_a_draft_len_schedule_reaches_model_yaml_sorted_and_doctor_checks_it(folders, tmp_path):
    """`--draft-len-schedule` as upstream's validator takes it (batch size 1 at max_draft_len, sorted); a schedule
    edited into model.yaml against those rules is doctor's error."""
    import yaml

    from trtspec.triton.doctor import doctor

    result = run("--flavour", "llmapi", "--hf", folders["base"], "--ngram", "--max-draft-len", "4",
                 "--draft-len-schedule", "8:0,1:4,4:2", "--out", tmp_path / "repo")
    assert result.exit_code == 0, result.output
    spec = model_yaml(tmp_path / "repo")["speculative_config"]
    assert list(spec["draft_len_schedule"].items()) == [(1, 4), (4, 2), (8, 0)]
    assert not [f for f in doctor(tmp_path / "repo") if f.severity == "error"]
    path = tmp_path / "repo" / "tensorrt_llm" / "1" / "model.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["speculative_config"]["draft_len_schedule"] = {2: 2}
    path.write_text(yaml.safe_dump(doc))
    errors = [f for f in doctor(tmp_path / "repo") if f.severity == "error"]
    assert [f.field for f in errors] == ["speculative_config.draft_len_schedule"]
    assert "needs an entry for batch size 1" in errors[0].message and "fails to load" in errors[0].message
    bad = run("--flavour", "llmapi", "--hf", folders["base"], "--ngram", "--draft-len-schedule", "1:3,two",
              "--out", tmp_path / "r2")
    assert bad.exit_code != 0 and bad.output.strip() == ("error: --draft-len-schedule '1:3,two': write BATCH:DRAFT_LEN "
                                                         "pairs, e.g. 1:4,4:2,8:0 ('two' is not one)")


def test_engine_with_llmapi_is_refused(folders, tmp_path):
    result = run(folders["base"], "--flavour", "llmapi", "--hf", folders["base"], "--out", tmp_path / "repo")
    assert result.exit_code != 0 and "not an engine" in result.output


# ---- trtspec's model.py against stand-ins -------------------------------------------------------------------

class _Tensor:
    def __init__(self, name, array):
        self._name, self._array = name, np.asarray(array)

    def name(self):
        return self._name

    def as_numpy(self):
        return self._array


class _Response:
    def __init__(self, output_tensors, error=None):
        self.tensors = {t.name(): t.as_numpy() for t in output_tensors}
        self.error = error


class _Request:
    def __init__(self, **inputs):
        self.inputs = {k: _Tensor(k, v) for k, v in inputs.items()}
        self.sent = []

    def get_response_sender(self):
        request = self

        class Sender:
            def send(self, response=None, flags=0):
                request.sent.append((response, flags))
        return Sender()


class _Completion:
    def __init__(self, text):
        self.text, self.finish_reason, self.stop_reason, self.cumulative_logprob = text, "length", None, -1.5


class _Output:
    def __init__(self, text):
        self.outputs = [_Completion(text)]


class _Result:
    def __init__(self, pieces):
        self.pieces = pieces

    def result(self):
        return _Output("".join(self.pieces))

    def __iter__(self):
        return iter(_Output("".join(self.pieces[:i + 1])) for i in range(len(self.pieces)))


class _LLM:
    instances = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []
        _LLM.instances.append(self)

    def generate_async(self, prompt, params, streaming=False):
        self.calls.append((prompt, params, streaming))
        return _Result([" one", " two"])

    def shutdown(self):
        pass


@pytest.fixture
def model(folders, tmp_path, monkeypatch):
    def load(decoupled):
        repo = deploy(folders, tmp_path, "eagle3", name=f"repo-{decoupled}", decoupled=decoupled)
        pb = types.ModuleType("triton_python_backend_utils")
        pb.Tensor, pb.InferenceResponse = _Tensor, _Response
        pb.TritonError = lambda message: message
        pb.TritonModelException = RuntimeError
        pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
        pb.get_model_dir = lambda: str(repo / "tensorrt_llm" / "1")
        pb.get_input_tensor_by_name = lambda request, name: request.inputs.get(name)
        trt = types.ModuleType("tensorrt_llm")
        trt.LLM, trt.SamplingParams = _LLM, lambda **kw: kw
        monkeypatch.setitem(sys.modules, "triton_python_backend_utils", pb)
        monkeypatch.setitem(sys.modules, "tensorrt_llm", trt)
        spec = importlib.util.spec_from_file_location(f"llmapi_model_{decoupled}",
                                                      repo / "tensorrt_llm" / "1" / "model.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        instance = module.TritonPythonModel()
        instance.initialize({"model_config": json.dumps({"parameters": {}})})
        return module, instance, repo
    return load


def test_model_hands_llm_the_yaml_less_triton_config(model):
    module, instance, repo = model(False)
    doc = model_yaml(repo)
    assert _LLM.instances[-1].kwargs == {k: v for k, v in doc.items() if k != "triton_config"}

    class AutoComplete:
        def set_model_transaction_policy(self, policy):
            self.policy = policy

        def set_max_batch_size(self, size):
            self.size = size
    auto = module.TritonPythonModel.auto_complete_config(AutoComplete())
    assert (auto.policy, auto.size) == ({"decoupled": False}, 0)


def test_model_answers_requests(model):
    _, instance, _ = model(False)
    request = _Request(text_input=np.array([b"hi"], dtype=object), sampling_param_max_tokens=np.array([2], np.int32),
                       sampling_param_temperature=np.array([0.0], np.float32), return_finish_reason=np.array([True]))
    bad = _Request(text_input=np.array([b"x"], dtype=object), sampling_param_beam_width=np.array([2], np.int32))
    good, refused = instance.execute([request, bad])
    assert good.tensors["text_output"].tolist() == [b" one two"] and good.tensors["finish_reason"].tolist() == ["length"]
    assert "beam" in refused.error
    assert instance.llm.calls[0][:2] == ("hi", {"max_tokens": 2, "temperature": 0.0})


def test_decoupled_model_streams_pieces(model):
    _, instance, _ = model(True)
    request = _Request(text_input=np.array([b"hi"], dtype=object), streaming=np.array([True]),
                       sampling_param_exclude_input_from_output=np.array([False]))
    assert instance.execute([request]) is None
    instance.threads[-1].join(timeout=5)
    pieces = [r.tensors["text_output"][0] for r, _ in request.sent if r is not None]
    assert pieces == [b"hi one", b" two"] and request.sent[-1] == (None, 1)
