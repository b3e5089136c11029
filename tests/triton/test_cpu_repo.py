"""`trtspec deploy --flavour cpu`: every config parses as Triton's ModelConfig, the ensemble is wired
consistently, the client contract is exposed, and bad input fails cleanly without a half-written repository."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.triton.contract import cpu_ensemble_inputs, cpu_ensemble_outputs
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions

MODELS = ("preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls")


def _config(repo, name) -> model_config_pb2.ModelConfig:
    return text_format.Parse((repo / name / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def test_every_config_parses_and_names_match_dirs(tiny_repo):
    assert sorted(p.name for p in tiny_repo.iterdir()) == sorted(MODELS)
    for name in MODELS:
        config = _config(tiny_repo, name)
        assert config.name == name and config.max_batch_size == 8
        assert "${" not in (tiny_repo / name / "config.pbtxt").read_text()
    for name in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"):
        assert (tiny_repo / name / "1" / "model.py").is_file()
    bls = _config(tiny_repo, "tensorrt_llm_bls")  # upstream's BLS interface: the ensemble's, plus draft-target's
    assert {t.name for t in bls.input} == {t.name for t in cpu_ensemble_inputs()} | {"num_draft_tokens",
                                                                                     "use_draft_logits"}
    assert bls.model_transaction_policy.decoupled
    engine = _config(tiny_repo, "tensorrt_llm")
    assert engine.model_transaction_policy.decoupled
    engine_dir = engine.parameters["engine_dir"].string_value
    assert not engine_dir.startswith("/") and (tiny_repo / engine_dir / "manifest.json").is_file()


def test_ensemble_is_wired_consistently(tiny_repo):
    """Every step input comes from an ensemble input or an earlier step's output, with the same data type;
    every ensemble output is produced by some step; every required model input is mapped."""
    ensemble = _config(tiny_repo, "ensemble")
    types = {t.name: t.data_type for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = _config(tiny_repo, step.model_name)
        inputs = {t.name: t for t in model.input}
        for key, value in step.input_map.items():
            assert value in types, f"{step.model_name}.{key} ← {value}: nothing produces {value} before this step"
            assert inputs[key].data_type == types[value], (step.model_name, key)
        assert {n for n, t in inputs.items() if not t.optional} <= set(step.input_map), step.model_name
        outputs = {t.name: t for t in model.output}
        for key, value in step.output_map.items():
            types[value] = outputs[key].data_type
    produced = set(types)
    for output in ensemble.output:
        assert output.name in produced and types[output.name] == output.data_type, output.name


def test_ensemble_exposes_the_client_contract(tiny_repo):
    ensemble = _config(tiny_repo, "ensemble")
    assert [t.name for t in ensemble.input] == [t.name for t in cpu_ensemble_inputs()]
    assert {t.name for t in ensemble.input if not t.optional} == {"text_input", "max_tokens"}
    assert [t.name for t in ensemble.output] == [t.name for t in cpu_ensemble_outputs()]
    names = {t.name for t in ensemble.input}
    assert {"random_seed", "seed", "min_length", "min_tokens", "stream", "use_speculation"} <= names


def test_options_reach_the_configs(tiny_engine, tmp_path):
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "r", instances=2, max_batch_size=4,
                                decoupled=False, chat_template=False, copy_engine=True))
    # --no-decoupled: the engine runs decoupled as trtspec_engine, tensorrt_llm forwards unary requests to it
    engine = _config(repo, "trtspec_engine")
    assert engine.max_batch_size == 4 and engine.instance_group[0].count == 2
    assert engine.model_transaction_policy.decoupled
    forwarder = _config(repo, "tensorrt_llm")
    assert not forwarder.model_transaction_policy.decoupled and forwarder.instance_group[0].count == 4
    assert [t.name for t in forwarder.input] == [t.name for t in engine.input]
    assert engine.parameters["engine_dir"].string_value == "trtspec_engine/1/engine"
    assert json.loads((repo / "trtspec_engine/1/engine/manifest.json").read_text())["method"] == "medusa"
    assert _config(repo, "preprocessing").parameters["chat_template"].string_value == "false"
    assert engine.parameters["spin"].string_value == "auto"  # the engine's rule: spin unless TRTSPEC_ORT_SPIN=0
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "s", spin=True))
    assert _config(repo, "tensorrt_llm").parameters["spin"].string_value == "true"
    assert engine.parameters["method"].string_value == "auto"  # the manifest's method
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "t", method="ngram"))
    assert _config(repo, "tensorrt_llm").parameters["method"].string_value == "ngram"
    assert engine.parameters["backoff"].string_value == "true"  # drafts shrink or rest while they do not pay
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "w", backoff=False))
    assert _config(repo, "tensorrt_llm").parameters["backoff"].string_value == "false"
    assert engine.parameters["draft_budget"].string_value == "0"  # the engine's K
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "b", method="ngram", draft_budget=2))
    assert _config(repo, "tensorrt_llm").parameters["draft_budget"].string_value == "2"


def test_a_datastore_is_referenced_or_copied_and_checked(tiny_engine, tmp_path):
    from trtspec.speculative.datastore import Datastore

    store = tmp_path / "stores" / "corpus.ds"
    Datastore.from_documents([[1, 2, 3, 4]], vocab_size=20).save(store)
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "a", method="suffix", datastore=store))
    path = _config(repo, "tensorrt_llm").parameters["datastore"].string_value
    assert path == "../stores/corpus.ds" and (repo / path).is_file()
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "b", datastore=store, copy_engine=True))
    assert _config(repo, "tensorrt_llm").parameters["datastore"].string_value == "tensorrt_llm/1/datastore.ds"
    assert (repo / "tensorrt_llm/1/datastore.ds").read_bytes() == store.read_bytes()
    Datastore.from_documents([[1, 2, 3, 4]], vocab_size=100000).save(store)
    with pytest.raises(ConfigError, match="--datastore .*corpus.ds: built for a vocabulary of 100000 tokens"):
        deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "c", datastore=store))
    assert not (tmp_path / "c").exists()


def test_repository_moves_with_the_engine(tiny_engine, tmp_path):
    """The engine is referenced relative to the repository: move both, the path still resolves."""
    shutil.copytree(tiny_engine, tmp_path / "a" / "engines" / "tiny")
    deploy(DeployOptions(engine_dir=tmp_path / "a" / "engines" / "tiny", out=tmp_path / "a" / "repo"))
    shutil.move(tmp_path / "a", tmp_path / "b")
    path = _config(tmp_path / "b" / "repo", "tensorrt_llm").parameters["engine_dir"].string_value
    assert path == "../engines/tiny" and (tmp_path / "b" / "repo" / path / "manifest.json").is_file()


@pytest.mark.parametrize("args,message", [
    (["--max-batch-size", "9"], "--max-batch-size 9 exceeds the engine's max_batch_size 8"),
    (["--instances", "0"], "--instances must be >= 1, got 0"),
    (["--flavour", "trtllm"], "--flavour trtllm needs a trtllm engine; the manifest's backend is 'onnx'"),
    (["--method", "lookup"], "--method 'lookup' is not one of none, medusa, eagle, eagle2, ngram, suffix, lookahead, "
                             "hybrid"),
    (["--method", "eagle"], "--method eagle: the engine was built for medusa (engine); it runs none, medusa, ngram, "
                            "suffix, lookahead or hybrid"),
    (["--datastore", "MISSING"], "does not exist"),
    (["--method", "hybrid", "--plain"], "--method hybrid: the engine was built for none"),
    (["--datastore", "CORRUPT"], "its first bytes are"),
    (["--draft-budget", "0"], "--draft-budget 0: the training-free drafters' tokens per step, 1 to the engine's "
                              "max_draft_len"),
    (["--draft-budget", "99"], "--draft-budget 99: the training-free drafters' tokens per step"),
])
def test_bad_options_fail_in_one_line_and_write_nothing(tiny_engine, tmp_path_factory, tmp_path, args, message):
    elsewhere = tmp_path_factory.mktemp("stores")
    (elsewhere / "corrupt.ds").write_bytes(b"\x00" * 64)
    args = [{"MISSING": str(elsewhere / "missing.ds"), "CORRUPT": str(elsewhere / "corrupt.ds")}.get(a, a) for a in args]
    engine = tiny_engine
    if "--plain" in args:  # the same engine without its heads
        engine = elsewhere / "plain"
        shutil.copytree(tiny_engine, engine)
        manifest = json.loads((engine / "manifest.json").read_text())
        manifest["method"] = "none"
        (engine / "manifest.json").write_text(json.dumps(manifest))
        args = [a for a in args if a != "--plain"]
    result = CliRunner().invoke(cli, ["deploy", str(engine), "--out", str(tmp_path / "repo"), *args])
    assert result.exit_code == 1 and result.output.strip() == f"error: {message}" or message in result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert not (tmp_path / "repo").exists() and list(tmp_path.iterdir()) == []


def test_engine_without_tokenizer_and_missing_manifest(tiny_engine, tmp_path):
    engine = tmp_path / "engine"
    shutil.copytree(tiny_engine, engine)
    manifest = json.loads((engine / "manifest.json").read_text())
    manifest["tokenizer"] = None
    (engine / "manifest.json").write_text(json.dumps(manifest))
    result = CliRunner().invoke(cli, ["deploy", str(engine), "--out", str(tmp_path / "repo")])
    assert result.exit_code == 1 and "the engine has no tokenizer (field 'tokenizer' is null)" in result.output
    assert not (tmp_path / "repo").exists()
    (engine / "manifest.json").unlink()
    result = CliRunner().invoke(cli, ["deploy", str(engine), "--out", str(tmp_path / "repo")])
    assert result.exit_code == 1 and "manifest.json" in result.output and "Traceback" not in result.output


def test_existing_repository_needs_force(tiny_engine, tmp_path):
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "keep").write_text("x")
    result = CliRunner().invoke(cli, ["deploy", str(tiny_engine), "--out", str(tmp_path / "repo")])
    assert result.exit_code == 1 and "pass --force" in result.output
    assert (tmp_path / "repo" / "keep").is_file()
    result = CliRunner().invoke(cli, ["deploy", str(tiny_engine), "--out", str(tmp_path / "repo"), "--force"])
    assert result.exit_code == 0 and not (tmp_path / "repo" / "keep").exists()


def test_the_contract_doc_names_every_tensor():
    """docs/triton-contract.md documents every tensor the CPU flavour's models take or send."""
    from pathlib import Path

    from trtspec.triton import cpu_repo

    doc = (Path(__file__).parents[2] / "docs" / "triton-contract.md").read_text()
    names = {t.name for group in (cpu_ensemble_inputs(), cpu_ensemble_outputs(), cpu_repo.PRE_INPUTS,
                                  cpu_repo.PRE_OUTPUTS, cpu_repo.POST_INPUTS, cpu_repo.POST_OUTPUTS,
                                  cpu_repo.ENGINE_OUTPUTS) for t in group}
    # the engine model's inputs beyond the ensemble's, named one by one or by their family
    families = ("lookahead_", "retention_", "mrope_", "encoder_", "prompt_table", "lora_", "runtime_top_p_")
    names |= {t.name for t in cpu_repo.ENGINE_INPUTS if not t.name.startswith(families)}
    internal = {"errors_in_band", "echo_ids", "one_response", "cross_attention_mask", "skip_cross_attn_blocks",
                "decoder_input_lengths", "input_ids", "input_lengths", "request_output_len"}
    missing = sorted(n for n in names - internal if n not in doc)
    assert not missing, missing


def test_a_served_engine_spins_as_generate_does_unless_deployed_otherwise(monkeypatch):
    """deploy --spin / --no-spin decide; "auto" is the engine's own rule (spin unless TRTSPEC_ORT_SPIN=0), as in
    generate: the product default is spinning, for the server as for one process."""
    from trtspec.model.ort_session import SPIN_ENV, effective_spin
    from trtspec.triton.model_args import served_spin

    assert served_spin("true") is True and served_spin("false") is False and served_spin("auto") is None
    monkeypatch.delenv(SPIN_ENV, raising=False)
    assert effective_spin(served_spin("auto")) is True
    monkeypatch.setenv(SPIN_ENV, "0")
    assert effective_spin(served_spin("auto")) is False
