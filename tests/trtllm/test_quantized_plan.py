"""`trtspec build --backend trtllm --weights int8|int4|fp8`: the quantize.py step, the trtllm-build command on its
output, the Medusa heads kept in the base dtype, checkpoints quantized already, the manifest, and bad input."""

from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.trtllm_plan import TrtllmBuildOptions, plan_trtllm_build
from trtspec.errors import BuildError, ConfigError


def plan(ckpt, tmp_path, **kwargs):
    return plan_trtllm_build(TrtllmBuildOptions(source=ckpt, out=tmp_path / "engine",
                                                **{"max_batch_size": 4, "trtllm_version": "1.2", **kwargs}))


def flags(argv) -> dict[str, str]:
    return dict(zip(argv[1::2], argv[2::2]))


def qflags(argv) -> dict[str, str]:
    """quantize.py's flags (after `python3 SCRIPT`)."""
    return dict(zip(argv[2::2], argv[3::2]))


@pytest.fixture
def medusa_ckpt(write_ckpt, tmp_path):
    """A float Vicuna-7B Medusa checkpoint `trtspec convert` wrote (its provenance names the HF folders)."""
    ckpt = write_ckpt(tmp_path, "vicuna-7b-medusa", weights=True)
    (ckpt / "trtspec-convert.json").write_text(json.dumps({
        "base": "/models/vicuna-7b-v1.3", "options": {"medusa": "/models/medusa-vicuna-7b-v1.3"}}))
    return ckpt


def test_int4_awq_plans_quantize_py_then_trtllm_build_on_its_output(medusa_ckpt, tmp_path):
    p = plan(medusa_ckpt, tmp_path, weights="int4")
    q = p.quantization
    quantized = tmp_path / "engine-int4_awq-ckpt"
    assert q.quantize_argv == (
        "python3", "examples/quantization/quantize.py", "--model_dir", "/models/vicuna-7b-v1.3", "--dtype", "float16",
        "--qformat", "int4_awq", "--output_dir", str(quantized), "--tp_size", "1", "--pp_size", "1",
        "--calib_size", "512", "--awq_block_size", "128", "--medusa_model_dir", "/models/medusa-vicuna-7b-v1.3",
        "--num_medusa_heads", "4", "--num_medusa_layers", "1", "--max_draft_len", "63")
    assert "--quant_medusa_head" not in q.quantize_argv  # the heads stay float16
    assert flags(p.argv)["--checkpoint_dir"] == str(quantized)
    assert (q.quant_algo, q.group_size, q.drafter) == ("W4A16_AWQ", 128, "float16")
    heads = [n for n in p.notes if "Medusa heads stay in float16" in n]
    assert heads and "NVIDIA/TensorRT-LLM#2115" in heads[0] and "#1845" in heads[0]
    assert p.manifest.quantization == q.to_dict() and p.to_dict()["quantization"]["quant_algo"] == "W4A16_AWQ"
    assert p.manifest.to_dict()["quantization"]["quantize_command"][1] == "examples/quantization/quantize.py"


@pytest.mark.parametrize("weights,qformat,algo", [("int8", "int8_wo", "W8A16"), ("fp8", "fp8", "FP8")])
def test_int8_weight_only_and_fp8(medusa_ckpt, tmp_path, weights, qformat, algo):
    p = plan(medusa_ckpt, tmp_path, weights=weights)
    assert qflags(p.quantization.quantize_argv)["--qformat"] == qformat and p.quantization.quant_algo == algo
    assert "--awq_block_size" not in p.quantization.quantize_argv and p.quantization.group_size is None


def test_quantize_heads_asks_for_it_and_warns(medusa_ckpt, tmp_path):
    p = plan(medusa_ckpt, tmp_path, weights="fp8", quantize_heads=True)
    assert p.quantization.quantize_argv[-1] == "--quant_medusa_head" and p.quantization.drafter == "quantized"
    assert any("#2115" in n and "--quant_medusa_head" in n for n in p.notes)


def test_a_plain_checkpoint_quantizes_without_medusa_flags(write_ckpt, tmp_path):
    ckpt = write_ckpt(tmp_path, "llama-3.1-8b", weights=True)
    (ckpt / "trtspec-convert.json").write_text(json.dumps({"base": "/models/llama-3.1-8b"}))
    p = plan(ckpt, tmp_path, weights="int4", block_size=64)
    argv = p.quantization.quantize_argv
    assert qflags(argv)["--dtype"] == "bfloat16" and qflags(argv)["--awq_block_size"] == "64"
    assert "--medusa_model_dir" not in argv and p.quantization.drafter is None


def test_a_checkpoint_quantized_already_is_built_as_it_is(write_ckpt, tmp_path):
    ckpt = write_ckpt(tmp_path, "vicuna-7b-medusa", weights=True,
                      quantization={"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128})
    p = plan(ckpt, tmp_path)
    assert p.quantization.quantize_argv is None and flags(p.argv)["--checkpoint_dir"] == str(ckpt)
    assert (p.quantization.weights, p.quantization.drafter) == ("int4", "as stored")
    assert plan(ckpt, tmp_path, weights="int4").quantization.quant_algo == "W4A16_AWQ"
    with pytest.raises(ConfigError, match="--weights int8: .* is quantized already \\(quant_algo=W4A16_AWQ\\)"):
        plan(ckpt, tmp_path, weights="int8")
    with pytest.raises(ConfigError, match="--block-size 64: .* quantized already .*group_size=128"):
        plan(ckpt, tmp_path, block_size=64)
    sq = write_ckpt(tmp_path / "sq", "vicuna-7b", weights=True, quantization={"quant_algo": "W8A8_SQ_PER_CHANNEL"})
    assert plan(sq, tmp_path).quantization.weights is None  # a mode --weights has no name for: recorded as is


def test_unquantized_builds_are_unchanged(medusa_ckpt, tmp_path):
    p = plan(medusa_ckpt, tmp_path)
    assert p.quantization is None and p.manifest.to_dict()["quantization"] is None
    assert flags(p.argv)["--checkpoint_dir"] == str(medusa_ckpt)


@pytest.mark.parametrize("kwargs,error,message", [
    ({"weights": "int2"}, ConfigError, "--weights int2: the trtllm backend builds int8, int4, fp8"),
    ({"weights": "int4", "block_size": 32}, ConfigError, "--block-size 32: INT4-AWQ groups of 64 or 128"),
    ({"weights": "int8", "block_size": 64}, ConfigError, "--block-size 64: applies to --weights int4"),
    ({"block_size": 64}, ConfigError, "--block-size 64: applies to --weights int4"),
])
def test_bad_quantization_flags(medusa_ckpt, tmp_path, kwargs, error, message):
    with pytest.raises(error, match=message):
        plan(medusa_ckpt, tmp_path, **kwargs)


def test_eagle_and_unknown_provenance_are_refused(write_ckpt, tmp_path):
    eagle = write_ckpt(tmp_path, "vicuna-7b-eagle", weights=True)
    with pytest.raises(BuildError, match="quantize.py takes Medusa heads but no EAGLE draft"):
        plan(eagle, tmp_path, weights="fp8")
    bare = write_ckpt(tmp_path / "bare", "vicuna-7b", weights=True)
    with pytest.raises(BuildError, match="without trtspec-convert.json, so the Hugging Face model .* is unknown"):
        plan(bare, tmp_path, weights="int8")


def test_build_waits_for_the_quantized_checkpoint_then_checks_its_mode(medusa_ckpt, write_ckpt, tmp_path,
                                                                     tokenizer_dir, fake_build):
    from trtspec.engine.trtllm_builder import build

    opts = TrtllmBuildOptions(source=medusa_ckpt, out=tmp_path / "engine", tokenizer=tokenizer_dir,
                              trtllm_version="1.2.1", max_batch_size=4, weights="int4")
    with pytest.raises(BuildError, match="no quantized checkpoint at .*engine-int4_awq-ckpt yet; run `python3 "
                                         "examples/quantization/quantize.py"):
        build(opts, runner=lambda argv, cwd: fake_build(argv, cwd))
    # what quantize.py writes: the same model, quant_algo W4A16_AWQ
    write_ckpt(tmp_path / "q", "vicuna-7b-medusa", weights=True,
               quantization={"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128})
    (tmp_path / "q" / "vicuna-7b-medusa").rename(tmp_path / "engine-int4_awq-ckpt")
    manifest = build(opts, runner=lambda argv, cwd: fake_build(argv, cwd))
    assert manifest.quantization["quant_algo"] == "W4A16_AWQ" and manifest.quantization["drafter"] == "float16"
    from trtspec.engine.summary import engine_summary

    summary = engine_summary(tmp_path / "engine")
    assert summary["quantization"] == "W4A16_AWQ, group_size 128, drafter float16" and "weights" not in summary

    def tamper(config):
        config["pretrained_config"]["quantization"]["quant_algo"] = "FP8"

    with pytest.raises(BuildError, match="pretrained_config.quantization.quant_algo"):
        build(TrtllmBuildOptions(source=medusa_ckpt, out=tmp_path / "engine", tokenizer=tokenizer_dir,
                                 trtllm_version="1.2.1", max_batch_size=4, weights="int4", force=True),
              runner=lambda argv, cwd: fake_build(argv, cwd, tamper=tamper))


def test_dry_run_prints_both_commands(medusa_ckpt, tmp_path):
    result = CliRunner().invoke(cli, ["build", str(medusa_ckpt), "--out", str(tmp_path / "e"), "--backend", "trtllm",
                                      "--weights", "int4", "--trtllm-version", "1.2", "--dry-run"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert shlex.split(lines[0])[1] == "examples/quantization/quantize.py"
    assert shlex.split(lines[1])[0] == "trtllm-build"
    assert "quantization               W4A16_AWQ, group 128, drafter float16" in result.output
    as_json = CliRunner().invoke(cli, ["build", str(medusa_ckpt), "--out", str(tmp_path / "e"), "--backend",
                                       "trtllm", "--weights", "fp8", "--trtllm-version", "1.2", "--dry-run", "--json"])
    assert json.loads(as_json.output)["quantization"]["quant_algo"] == "FP8"
    bad = CliRunner().invoke(cli, ["build", str(medusa_ckpt), "--out", str(tmp_path / "e"), "--backend", "trtllm",
                                   "--lm-head-weights", "int8", "--dry-run"])
    assert bad.exit_code == 2 and "--lm-head-weights applies to --backend onnx only" in bad.output


@pytest.fixture
def quantized_repo(medusa_ckpt, write_ckpt, tmp_path, tokenizer_dir, fake_build):
    """A Medusa INT4-AWQ engine built through the quantize step (its output written by hand here) and deployed."""
    from trtspec.engine.trtllm_builder import build
    from trtspec.triton.deploy import DeployOptions, deploy

    write_ckpt(tmp_path / "q", "vicuna-7b-medusa", weights=True,
               quantization={"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": 128})
    (tmp_path / "q" / "vicuna-7b-medusa").rename(tmp_path / "engine-int4_awq-ckpt")
    build(TrtllmBuildOptions(source=medusa_ckpt, out=tmp_path / "engine", tokenizer=tokenizer_dir,
                             trtllm_version="1.2.1", max_batch_size=4, weights="int4"),
          runner=lambda argv, cwd: fake_build(argv, cwd))
    return deploy(DeployOptions(engine_dir=tmp_path / "engine", out=tmp_path / "repo")), tmp_path / "engine"


def test_doctor_carries_the_quantization_mode(quantized_repo):
    from trtspec.triton.doctor import doctor

    repo, engine = quantized_repo
    findings = doctor(repo)
    assert [(f.severity, f.field, f.message) for f in findings if f.field != "request tensors"] == [
        ("note", "quantization", "quant_algo=W4A16_AWQ, group_size=128, drafter float16")]
    result = CliRunner().invoke(cli, ["doctor", str(repo)])
    assert result.exit_code == 0 and "no problems found" in result.output and "quant_algo=W4A16_AWQ" in result.output


def test_doctor_names_an_engine_built_in_another_mode_than_planned(quantized_repo):
    from trtspec.triton.doctor import doctor

    repo, engine = quantized_repo
    config = json.loads((engine / "config.json").read_text())
    config["pretrained_config"]["quantization"]["quant_algo"] = "FP8"
    (engine / "config.json").write_text(json.dumps(config))
    errors = [f for f in doctor(repo) if f.severity == "error"]
    assert [(f.field, f.message) for f in errors] == [
        ("quantization", "the engine was built with quant_algo=FP8, its manifest planned W4A16_AWQ: rebuild it")]
    manifest = json.loads((engine / "manifest.json").read_text())
    manifest["quantization"]["drafter"] = "quantized"
    manifest["quantization"]["quant_algo"] = "FP8"
    (engine / "manifest.json").write_text(json.dumps(manifest))
    [warning] = [f for f in doctor(repo) if f.severity == "warning" and f.field == "quantization"]
    assert "TensorRT-LLM#2115" in warning.message and "#1845" in warning.message
