"""`trtspec doctor`: each pain-point mismatch, made by hand in a repository or engine trtspec wrote correctly,
is reported with the model, the field and the fix (tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py and the pain points in docs/upstream-sources.md)."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.trtllm_plan import Lookahead
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.doctor import doctor


@pytest.fixture(scope="module")
def repos(checkpoints, write_ckpt, tokenizer_dir, tmp_path_factory, engine_builder):
    root = tmp_path_factory.mktemp("doctor")
    small = write_ckpt(root, "vicuna-7b-medusa", weights=True, max_draft_len=8)
    specs = {"medusa": (checkpoints["vicuna-7b-medusa"], {}), "medusa8": (small, {"preset": "medusa_small_8"}),
             "eagle": (checkpoints["vicuna-7b-eagle"], {}),
             "lookahead": (checkpoints["llama-3.1-8b"], {"lookahead": Lookahead(7, 7, 7)}),
             "target": (checkpoints["llama-3.1-8b"], {"draft_target": True, "max_draft_len": 10}),
             "draft": (checkpoints["llama-3.2-1b"], {})}
    for name, (ckpt, kwargs) in specs.items():
        engine_builder(ckpt, root / "engines" / name, tokenizer_dir, **kwargs)
    for name in ("medusa", "medusa8", "eagle", "lookahead"):
        deploy(DeployOptions(engine_dir=root / "engines" / name, out=root / "repos" / name))
    deploy(DeployOptions(engine_dir=root / "engines" / "target", out=root / "repos" / "target",
                         draft_engine_dir=root / "engines" / "draft"))
    return root


def copy(repos, name, tmp_path):
    shutil.copytree(repos / "repos" / name, tmp_path / name)
    return tmp_path / name


def edit(repo, model, old, new, count=1):
    path = repo / model / "config.pbtxt"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, count))


def set_param(repo, model, key, value):
    path = repo / model / "config.pbtxt"
    text, block = path.read_text(), re.compile(r'parameters \{\n  key: "' + re.escape(key) + r'"\n.*?\n\}\n', re.S)
    new = f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n' if value is not None else ""
    path.write_text(block.sub(new, text) if block.search(text) else text + new)


def engine_json(repos, name, tmp_path, change):
    """A copy of an engine dir with its config.json edited."""
    engine = tmp_path / f"engine-{name}"
    shutil.copytree(repos / "engines" / name, engine)
    config = json.loads((engine / "config.json").read_text())
    change(config)
    (engine / "config.json").write_text(json.dumps(config))
    return engine


# (repository, breakage, severity, model, field, words of the message)
CASES = [
    # tensorrtllm_backend#526: unfilled template keys
    ("medusa", lambda r: edit(r, "tensorrt_llm", 'backend: "tensorrtllm"', 'backend: "${triton_backend}"'),
     "error", "tensorrt_llm", "triton_backend", "unfilled placeholder"),
    ("medusa", lambda r: edit(r, "ensemble", "max_batch_size: 4", "max_batch_size: ${triton_max_batch_size}"),
     "error", "ensemble", "triton_max_batch_size", "unfilled placeholder"),
    # tensorrtllm_backend tensorrt_llm/config.pbtxt: Python list syntax is silently replaced by mc_sim_7b_63
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "medusa_choices", "[[0], [0, 0], [1]]"),
     "error", "tensorrt_llm", "medusa_choices", "Python list syntax"),
    # FasterDecoding/Medusa#76: a tree deeper than the heads
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "medusa_choices", "{0}, {0, 0}, {0, 0, 0}, {0, 0, 0, 0}, "
                                                                         "{0, 0, 0, 0, 0}"),
     "error", "tensorrt_llm", "medusa_choices", "exceeds the 4 Medusa heads"),
    # tensorrtllm_backend#473 and its family: the default tree (63 nodes) on an engine built for K = 8
    ("medusa8", lambda r: set_param(r, "tensorrt_llm", "medusa_choices", None),
     "error", "tensorrt_llm", "medusa_choices", "63 tree nodes, more than the engine's max_draft_len 8; set "
                                              "medusa_choices to a tree that fits"),
    # NVIDIA/TensorRT-LLM#1449 (TensorRT-LLM#1449): top_k / top_p on a Medusa engine returns zeros
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "decoding_mode", "top_k_top_p"),
     "error", "tensorrt_llm", "decoding_mode", "TensorRT-LLM#1449"),
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "decoding_mode", None),
     "warning", "tensorrt_llm", "decoding_mode", "unset on a medusa engine"),
    # TensorRT-LLM tensorrt_llm/llmapi/llm_args.py: EAGLE-1 tree depth == num_eagle_layers
    ("eagle", lambda r: set_param(r, "tensorrt_llm", "eagle_choices", "{0}, {0, 0}, {0, 0, 0}"),
     "error", "tensorrt_llm", "eagle_choices", "EAGLE-1 needs tree depth == num_eagle_layers = 4"),
    # tensorrtllm_backend#710: (W, N, G) vs the engine's max_draft_len
    ("lookahead", lambda r: set_param(r, "tensorrt_llm", "lookahead_window_size", "4"),
     "error", "tensorrt_llm", "lookahead_*", "needs max_draft_len 65, the engine has 83"),
    ("lookahead", lambda r: set_param(r, "tensorrt_llm", "lookahead_ngram_size", None),
     "error", "tensorrt_llm", "lookahead_*", "needs all three"),
    # tensorrtllm_backend#62: decoupled on tensorrt_llm and the BLS must agree
    ("medusa", lambda r: edit(r, "tensorrt_llm_bls", "decoupled: true", "decoupled: false"),
     "error", "tensorrt_llm_bls", "decoupled", "keep decoupled_mode identical"),
    # server#7275: postprocessing fed from preprocessing while the LLM step is decoupled
    ("medusa", lambda r: edit(r, "ensemble", 'input_map { key: "SEQUENCE_LENGTH" value: "_SEQUENCE_LENGTH" }',
                              'input_map { key: "SEQUENCE_LENGTH" value: "_REQUEST_INPUT_LEN" }'),
     "error", "ensemble", "postprocessing", "server#7275"),
    # TensorRT-LLM triton_backend/all_models/: a renamed tensor (v0.19 spelling in the ensemble, newest on tensorrt_llm)
    ("medusa", lambda r: edit(r, "ensemble", 'input_map { key: "min_tokens" value: "min_tokens" }',
                              'input_map { key: "min_length" value: "min_tokens" }'),
     "error", "ensemble", "tensorrt_llm.min_length", "has no input 'min_length'"),
    # tensorrtllm_backend#473: BLS sends draft tokens to a target not built for them
    ("target", lambda r, root: set_param(r, "tensorrt_llm", "gpt_model_path", str(root / "engines" / "draft")),
     "error", "tensorrt_llm", "speculative_decoding_mode", "Number of draft tokens (N) is larger than maximum"),
    ("target", lambda r: set_param(r, "tensorrt_llm_draft", "enable_kv_cache_reuse", "false"),
     "warning", "tensorrt_llm_draft", "enable_kv_cache_reuse", "resends the whole sequence"),
    ("target", lambda r: set_param(r, "tensorrt_llm_bls", "tensorrt_llm_draft_model_name", "draft_llm"),
     "error", "tensorrt_llm_bls", "tensorrt_llm_draft_model_name", "not in the repository"),
    # tensorrtllm_backend#364: a removed key
    ("medusa", lambda r: set_param(r, "preprocessing", "tokenizer_type", "llama"),
     "warning", "preprocessing", "tokenizer_type", "removed in v0.9"),
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "gpt_model_type", "dynamic"),
     "error", "tensorrt_llm", "gpt_model_type", "is not one of"),
    # tensorrtllm_backend#115, #130: beam width and batch size
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "max_beam_width", "2"),
     "error", "tensorrt_llm", "max_beam_width", "beam search cannot be combined with draft tokens"),
    ("medusa", lambda r: edit(r, "tensorrt_llm", "max_batch_size: 4", "max_batch_size: 16"),
     "warning", "tensorrt_llm", "max_batch_size", "exceeds the engine's max_batch_size 4"),
    ("medusa", lambda r: set_param(r, "tensorrt_llm", "gpt_model_path", "/nonexistent/engine"),
     "error", "tensorrt_llm", "gpt_model_path", "holds no engine config.json"),
    ("medusa", lambda r: edit(r, "tensorrt_llm", "data_type: TYPE_FP32\n    dims: [ -1, -1, -1 ]",
                              "data_type: TYPE_FP16\n    dims: [ -1, -1, -1 ]"),
     "error", "tensorrt_llm", "logits_datatype", "the engine's logits_dtype is float32"),
    ("medusa", lambda r: set_param(r, "postprocessing", "tokenizer_dir", "/nonexistent/tokenizer"),
     "error", "postprocessing", "tokenizer_dir", "does not exist"),
]


@pytest.mark.parametrize("name,breakage,severity,model,field,message", CASES)
def test_each_mismatch_is_reported(repos, tmp_path, name, breakage, severity, model, field, message):
    repo = copy(repos, name, tmp_path)
    breakage(repo) if breakage.__code__.co_argcount == 1 else breakage(repo, repos)
    found = [f for f in doctor(repo) if (f.severity, f.model, f.field) == (severity, model, field)]
    assert found and message in found[0].message, doctor(repo)


@pytest.mark.parametrize("name,change,field,message", [
    # TensorRT-LLM tensorrt_llm/builder.py Engine.save: Medusa's runtime reads pretrained_config.max_draft_len
    ("medusa", lambda c: c["pretrained_config"].update(max_draft_len=31), "engine max_draft_len",
     "the Medusa runtime reads the former"),
    ("eagle", lambda c: c["build_config"]["plugin_config"].update(use_paged_context_fmha=False),
     "enable_chunked_context", "needs an engine built with --use_paged_context_fmha enable"),
    # tensorrtllm_backend#396, #662: engine and manifest versions disagree
    ("medusa", lambda c: c.update(version="0.17.0"), "engine version", "manifest.json says TensorRT-LLM 1.2"),
])
def test_engine_side_mismatches(repos, tmp_path, name, change, field, message):
    repo = copy(repos, name, tmp_path)
    engine = engine_json(repos, name, tmp_path, change)
    if field == "enable_chunked_context":
        set_param(repo, "tensorrt_llm", field, "true")
    found = [f for f in doctor(repo, engine) if f.field == field]
    assert found and found[0].severity == "error" and message in found[0].message, doctor(repo, engine)


def test_cli(repos, tmp_path):
    good = CliRunner().invoke(cli, ["doctor", str(repos / "repos" / "eagle")])
    assert good.exit_code == 0 and good.stdout.strip().endswith("no problems found")
    repo = copy(repos, "medusa", tmp_path)
    set_param(repo, "tensorrt_llm", "decoding_mode", "top_k")
    bad = CliRunner().invoke(cli, ["doctor", str(repo), str(repos / "engines" / "medusa")])
    assert bad.exit_code == 1
    assert bad.stdout.startswith("error: tensorrt_llm: decoding_mode: 'top_k' on a medusa engine")
    as_json = json.loads(CliRunner().invoke(cli, ["doctor", str(repo), "--json"]).stdout)
    assert as_json["errors"] == 1 and as_json["findings"][0]["field"] == "decoding_mode"
    empty = CliRunner().invoke(cli, ["doctor", str(tmp_path / "medusa" / "tensorrt_llm" / "1")])
    assert empty.exit_code == 1 and "no model" in empty.output
