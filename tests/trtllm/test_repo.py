"""`deploy --flavour trtllm`: every config parsed through Triton's ModelConfig protobuf, every placeholder filled
from the manifest, the client contract shared with the CPU flavour, version differences, multi-GPU launch."""

from __future__ import annotations

import re

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from trtspec.engine.trtllm_plan import Lookahead, cpp_choices
from trtspec.errors import ConfigError, RepositoryError
from trtspec.speculative.tree import parse_choices
from trtspec.triton import contract
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.doctor import doctor

MODELS = {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls"}


def parse(path) -> dict:
    message = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(message, preserving_proto_field_name=True)


def configs(repo) -> dict[str, dict]:
    return {p.parent.name: parse(p) for p in repo.glob("*/config.pbtxt")}


def params(config) -> dict[str, str]:
    return {k: v["string_value"] for k, v in config.get("parameters", {}).items()}


@pytest.fixture(scope="module")
def engines(checkpoints, tokenizer_dir, tmp_path_factory, engine_builder):
    root = tmp_path_factory.mktemp("engines")
    specs = {"medusa": ("vicuna-7b-medusa", {}, "1.2.1"), "eagle": ("vicuna-7b-eagle", {}, "0.17.0"),
             "eagle-0.15": ("vicuna-7b-eagle", {}, "0.15.0"),
             "lookahead": ("llama-3.1-8b", {"lookahead": Lookahead(7, 7, 7)}, "0.19.0"),
             "lookahead-0.18": ("llama-3.1-8b", {"lookahead": Lookahead(7, 7, 7)}, "0.18.2"),
             "target": ("llama-3.1-8b", {"draft_target": True, "max_draft_len": 10}, "1.0.0"),
             "draft": ("llama-3.2-1b", {}, "1.0.0"), "draft-0.21": ("llama-3.2-1b", {}, "0.21.0"),
             "plain": ("vicuna-7b", {}, "0.17.0")}
    for name, (ckpt, kwargs, version) in specs.items():
        engine_builder(checkpoints[ckpt], root / name, tokenizer_dir, version=version, **kwargs)
    return root


def write(engines, tmp_path, name, **kwargs):
    return deploy(DeployOptions(engine_dir=engines / name, out=tmp_path / f"repo-{name}", **kwargs))


@pytest.mark.parametrize("name,extra", [("medusa", {}), ("eagle", {}), ("lookahead", {}), ("plain", {}),
                                        ("target", {"draft": True})])
def test_every_config_parses_and_nothing_is_left_unfilled(engines, tmp_path, name, extra):
    repo = write(engines, tmp_path, name, **({"draft_engine_dir": engines / "draft"} if extra else {}))
    found = configs(repo)
    assert set(found) == MODELS | ({"tensorrt_llm_draft"} if extra else set())
    for path in repo.rglob("*"):
        if path.is_file():
            assert "${" not in path.read_text(), path
    for model in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert "TritonPythonModel" in (repo / model / "1" / "model.py").read_text()
    assert (repo / "ensemble" / "1").is_dir() and (repo / "tensorrt_llm" / "1").is_dir()
    assert _problems(doctor(repo)) == []


def test_medusa_placeholders_come_from_the_manifest(engines, tmp_path):
    repo = write(engines, tmp_path, "medusa", max_batch_size=2, decoupled=False)
    found = configs(repo)
    llm = params(found["tensorrt_llm"])
    assert llm["gpt_model_path"] == str((engines / "medusa").resolve())
    assert (llm["decoding_mode"], llm["gpt_model_type"], llm["max_beam_width"]) == \
        ("medusa", "inflight_fused_batching", "1")
    assert llm["medusa_choices"].startswith("{0}, {1}, ") and "[" not in llm["medusa_choices"]
    assert len(parse_choices(llm["medusa_choices"])) == 63
    for name in ("tensorrt_llm", "ensemble", "preprocessing", "postprocessing", "tensorrt_llm_bls"):
        assert found[name]["max_batch_size"] == 2
    assert found["tensorrt_llm"]["model_transaction_policy"].get("decoupled", False) is False
    assert found["tensorrt_llm_bls"]["model_transaction_policy"].get("decoupled", False) is False
    assert params(found["preprocessing"])["tokenizer_dir"] == str((engines / "medusa" / "tokenizer").resolve())
    assert params(found["tensorrt_llm_bls"])["max_draft_len"] == "63"


def test_eagle_and_lookahead_parameters(engines, tmp_path):
    eagle = params(configs(write(engines, tmp_path, "eagle"))["tensorrt_llm"])
    assert eagle["decoding_mode"] == "eagle" and eagle["eagle_choices"] == cpp_choices(parse_choices(
        eagle["eagle_choices"]))
    lookahead = params(configs(write(engines, tmp_path, "lookahead"))["tensorrt_llm"])
    assert {k: lookahead[k] for k in ("decoding_mode", "lookahead_window_size", "lookahead_ngram_size",
                                      "lookahead_verification_set_size")} == \
        {"decoding_mode": "lookahead", "lookahead_window_size": "7", "lookahead_ngram_size": "7",
         "lookahead_verification_set_size": "7"}


def test_draft_target_models_for_the_bls(engines, tmp_path):
    found = configs(write(engines, tmp_path, "target", draft_engine_dir=engines / "draft"))
    target, draft, bls = (params(found[n]) for n in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"))
    assert draft["gpt_model_path"] == str((engines / "draft").resolve())
    assert bls["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft" and bls["max_draft_len"] == "10"
    assert target["enable_kv_cache_reuse"] == draft["enable_kv_cache_reuse"] == "true"
    assert float(target["kv_cache_free_gpu_mem_fraction"]) == float(draft["kv_cache_free_gpu_mem_fraction"]) == 0.45
    for name in ("tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"):  # the DTM loop never streams
        assert found[name]["model_transaction_policy"].get("decoupled", False) is False
    assert {t["name"] for t in found["tensorrt_llm_bls"]["input"]} >= {"num_draft_tokens", "use_draft_logits"}


# The request tensors of upstream's ensemble/config.pbtxt, by release (tensorrtllm_backend tags v0.15.0-v0.19.0,
# all_models/inflight_batcher_llm/; TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/ from 0.20, whose copy
# renames min_length / random_seed to min_tokens / seed: tensorrtllm_backend c2e65b8, not on the 0.19 branch). Its newest copy also has return_num_input_tokens /
# return_num_output_tokens, which trtspec does not declare (docs/triton-contract.md says why).
_V015 = {"text_input", "decoder_text_input", "max_tokens", "num_return_sequences", "bad_words", "stop_words", "end_id",
         "pad_id", "top_k", "top_p", "temperature", "length_penalty", "repetition_penalty", "min_length",
         "presence_penalty", "frequency_penalty", "random_seed", "return_log_probs", "return_context_logits",
         "return_generation_logits", "beam_width", "stream", "prompt_embedding_table", "prompt_table_extra_id",
         "prompt_vocab_size", "embedding_bias_words", "embedding_bias_weights", "lora_task_id", "lora_weights",
         "lora_config"}
_V016 = _V015 | {"exclude_input_in_output", "return_kv_cache_reuse_stats"}  # v0.16-v0.18
_V019 = _V016 - {"return_kv_cache_reuse_stats"} | {"return_perf_metrics", "guided_decoding_guide_type",
                                                   "guided_decoding_guide"}
_V1 = _V019 - {"min_length", "random_seed"} | {"min_tokens", "seed"}
# v0.15's ensemble lacks exclude_input_in_output, which its tensorrt_llm takes: trtspec declares it for every version
UPSTREAM_ENSEMBLE_INPUTS = {"1.2.1": _V1, "1.0.0": _V1, "0.20.0": _V1, "0.19.0": _V019, "0.17.0": _V016,
                            "0.15.0": _V015 | {"exclude_input_in_output"}}
# what the wiring hands tensorrt_llm for each of upstream's extra inputs (tensorrtllm_backend ensemble/config.pbtxt)
THROUGH_PREPROCESSING = {"embedding_bias_words": ("EMBEDDING_BIAS_WORDS", "EMBEDDING_BIAS", "embedding_bias"),
                         "embedding_bias_weights": ("EMBEDDING_BIAS_WEIGHTS", "EMBEDDING_BIAS", "embedding_bias"),
                         "decoder_text_input": ("DECODER_QUERY", "DECODER_INPUT_ID", "decoder_input_ids"),
                         "prompt_table_extra_id": ("PROMPT_TABLE_EXTRA_ID", "OUT_PROMPT_TABLE_EXTRA_IDS",
                                                   "prompt_table_extra_ids")}
STRAIGHT_TO_LLM = {"lora_task_id", "lora_weights", "lora_config", "prompt_embedding_table", "prompt_vocab_size",
                   "guided_decoding_guide_type", "guided_decoding_guide", "return_perf_metrics",
                   "return_kv_cache_reuse_stats"}
# tensorrt_llm's declarations of them in upstream's tensorrt_llm/config.pbtxt: type, dims, reshape to a scalar
UPSTREAM_LLM_INPUTS = {"embedding_bias": ("TYPE_FP32", (-1,), False), "decoder_input_ids": ("TYPE_INT32", (-1,), False),
                       "decoder_input_lengths": ("TYPE_INT32", (1,), True),
                       "prompt_table_extra_ids": ("TYPE_UINT64", (-1,), False),
                       "prompt_embedding_table": ("TYPE_FP16", (-1, -1), False),
                       "prompt_vocab_size": ("TYPE_INT32", (1,), True), "lora_task_id": ("TYPE_UINT64", (1,), True),
                       "lora_weights": ("TYPE_FP16", (-1, -1), False), "lora_config": ("TYPE_INT32", (-1, 3), False),
                       "guided_decoding_guide_type": ("TYPE_STRING", (1,), False),
                       "guided_decoding_guide": ("TYPE_STRING", (1,), False),
                       "return_perf_metrics": ("TYPE_BOOL", (1,), True),
                       "return_kv_cache_reuse_stats": ("TYPE_BOOL", (1,), True)}


@pytest.mark.parametrize("name,version", [("medusa", "1.2.1"), ("target", "1.0.0"), ("eagle", "0.17.0"),
                                          ("lookahead", "0.19.0"), ("eagle-0.15", "0.15.0")])
def test_gpu_and_cpu_flavours_expose_the_same_request_tensors(engines, tmp_path, name, version):
    """The GPU ensemble declares exactly the request tensors upstream's ensemble of the engine's release declares, each
    with the CPU flavour's type and dims (the CPU flavour declares them all, v0.19's set, and refuses in one line what
    its engine cannot honour), and wires each as upstream's does: through preprocessing or straight to tensorrt_llm,
    which declares it as upstream's tensorrt_llm does, so the C++ backend honours it."""
    extra = {"draft_engine_dir": engines / "draft"} if name == "target" else {}
    repo = write(engines, tmp_path, name, **extra)
    found = configs(repo)
    ensemble = found["ensemble"]
    gpu = {t["name"]: (t["data_type"], tuple(int(d) for d in t["dims"])) for t in ensemble["input"]}
    assert set(gpu) == UPSTREAM_ENSEMBLE_INPUTS[version]
    newest = not version.startswith(("0.15", "0.16", "0.17", "0.18", "0.19"))
    client = {t.name: (t.data_type, t.dims) for t in contract.client_inputs(newest_names=newest)}
    assert {k: gpu[k] for k in client} == client  # every client tensor, same type and dims
    cpu = {t.name: (t.data_type, t.dims) for t in contract.cpu_ensemble_inputs()}
    only_gpu = {"return_kv_cache_reuse_stats"}  # v0.16-v0.18's switch; the CPU contract follows v0.19
    if version < "0.16":  # v0.15 has no metrics switch
        assert not {"return_kv_cache_reuse_stats", "return_perf_metrics"} & set(gpu)
    assert {k: v for k, v in gpu.items() if k not in only_gpu} == {k: cpu[k] for k in gpu if k not in only_gpu}
    assert set(cpu) - set(gpu) <= set(contract.RENAMED_INPUTS) | set(contract.RENAMED_INPUTS.values()) | {
        t.name for t in contract.TRTSPEC_INPUTS} | ({"guided_decoding_guide_type", "guided_decoding_guide",
                                                     "return_perf_metrics"} if version < "0.19" else set())
    required = {t["name"] for t in ensemble["input"] if not t.get("optional")}
    assert required == {t.name for t in contract.ENSEMBLE_INPUTS if not t.optional} == {"text_input", "max_tokens"}
    outputs = {t["name"] for t in ensemble["output"]}
    assert {t.name for t in contract.ENSEMBLE_OUTPUTS} | {"output_ids", "context_logits", "generation_logits"} <= outputs

    steps = {s["model_name"]: s for s in ensemble["ensemble_scheduling"]["step"]}
    pre, llm = steps["preprocessing"], steps["tensorrt_llm"]
    llm_from = {value: key for key, value in llm["input_map"].items()}  # ensemble tensor → tensorrt_llm input
    for client_name, (pre_in, pre_out, llm_in) in THROUGH_PREPROCESSING.items():
        assert pre["input_map"][pre_in] == client_name
        assert llm["input_map"][llm_in] == pre["output_map"][pre_out], llm_in
    assert llm["input_map"]["decoder_input_lengths"] == pre["output_map"]["REQUEST_DECODER_INPUT_LEN"]
    for client_name in STRAIGHT_TO_LLM & set(gpu):
        assert llm_from[client_name] == client_name
    declared = {t["name"]: t for t in found["tensorrt_llm"]["input"]}
    for llm_name in set(llm["input_map"]) & set(UPSTREAM_LLM_INPUTS):
        data_type, dims, scalar = UPSTREAM_LLM_INPUTS[llm_name]
        t = declared[llm_name]
        assert (t["data_type"], tuple(int(d) for d in t["dims"]), "reshape" in t, t.get("optional")) == \
            (data_type, dims, scalar, True), llm_name
    bls = {t["name"] for t in found["tensorrt_llm_bls"]["input"]}
    assert bls == set(gpu) | {"num_draft_tokens", "use_draft_logits"}  # upstream's BLS takes them too
    assert _problems(doctor(repo)) == []


def test_renamed_inputs_follow_the_engine_version(engines, tmp_path):
    new = configs(write(engines, tmp_path, "medusa"))["tensorrt_llm"]
    old = configs(write(engines, tmp_path, "eagle"))["tensorrt_llm"]
    names = lambda c: {t["name"] for t in c["input"]}  # noqa: E731
    assert {"min_tokens", "seed"} <= names(new) and not {"min_length", "random_seed"} & names(new)
    assert {"min_length", "random_seed"} <= names(old) and not {"min_tokens", "seed"} & names(old)
    assert "return_perf_metrics" not in names(old) and "lookahead_window_size" not in names(old)  # 0.17


@pytest.mark.parametrize("name,kwargs,message", [
    ("lookahead-0.18", {}, "lookahead on Triton needs the tensorrt_llm model's lookahead_* parameters"),
    ("target", {}, "is a draft-target engine: pass --draft-engine DIR"),
    ("medusa", {"draft_engine_dir": "draft"}, "--draft-engine needs a draft-target engine"),
    ("target", {"draft_engine_dir": "medusa"}, "the draft engine must be a plain trtllm engine"),
    ("target", {"draft_engine_dir": "draft-0.21"}, "the draft was built by TensorRT-LLM 0.21.0, the target by 1.0.0"),
    ("medusa", {"batching_strategy": "dynamic"}, "batching strategy 'dynamic' is not one of"),
    ("medusa", {"max_batch_size": 8}, "exceeds the engine's max_batch_size 4"),
])
def test_deploy_errors(engines, tmp_path, name, kwargs, message):
    if "draft_engine_dir" in kwargs:
        kwargs["draft_engine_dir"] = engines / kwargs["draft_engine_dir"]
    with pytest.raises((RepositoryError, ConfigError), match=re.escape(message)):
        write(engines, tmp_path, name, **kwargs)
    assert not (tmp_path / f"repo-{name}").exists()


def test_eagle_tree_needs_eagle_choices_parameter_on_015(engines, tmp_path, checkpoints, tokenizer_dir,
                                                         engine_builder):
    repo = write(engines, tmp_path, "eagle-0.15")  # the default tree: the server's default is the same
    assert "eagle_choices" not in params(configs(repo)["tensorrt_llm"])
    engine_builder(checkpoints["vicuna-7b-eagle"], tmp_path / "small", tokenizer_dir, version="0.15.0",
                   choices="[[0],[0,0],[0,0,0],[0,0,0,0]]")
    with pytest.raises(RepositoryError, match="has no eagle_choices parameter"):
        deploy(DeployOptions(engine_dir=tmp_path / "small", out=tmp_path / "repo-small"))


def test_multi_gpu_launch_script(write_ckpt, tokenizer_dir, tmp_path, engine_builder):
    ckpt = write_ckpt(tmp_path, "vicuna-7b-medusa", weights=True, mapping={"world_size": 2, "tp_size": 2,
                                                                           "pp_size": 1})
    engine_builder(ckpt, tmp_path / "engine", tokenizer_dir)
    repo = deploy(DeployOptions(engine_dir=tmp_path / "engine", out=tmp_path / "repo"))
    script = (repo / "launch_triton.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash") and "exec mpirun --allow-run-as-root" in script
    ranks = script.split("exec mpirun --allow-run-as-root")[1].split(" : ")
    assert len(ranks) == 2 and "--load-model" not in ranks[0]
    assert "--model-control-mode=explicit --load-model=tensorrt_llm" in ranks[1]
    assert "shm-region-prefix-name=prefix1_" in ranks[1] and f"--model-repository={repo}" in ranks[1]
    assert (repo / "launch_triton.sh").stat().st_mode & 0o111


def _problems(findings):
    """The errors and warnings (a note is a fact, e.g. which request tensor names the ensemble takes)."""
    return [f for f in findings if f.severity != "note"]


@pytest.mark.parametrize("name,names", [("lookahead", "min_length / random_seed"), ("draft-0.21", "min_tokens / seed"),
                                        ("medusa", "min_tokens / seed")])
def test_doctor_says_which_request_names_the_ensemble_takes(engines, tmp_path, name, names):
    """0.19 takes the old names, 0.21 and 1.2 the new: the rename shipped with 0.20 (tensorrtllm_backend c2e65b8 is
    not on the 0.19 release branch)."""
    repo = write(engines, tmp_path, name)
    notes = [f for f in doctor(repo) if f.severity == "note"]
    assert len(notes) == 1 and notes[0].message.startswith(f"takes {names} (TensorRT-LLM")
