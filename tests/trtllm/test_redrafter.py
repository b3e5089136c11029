"""ReDrafter on the GPU engine flow (issue 35, second slice), on tiny checkpoints `trtspec convert --redrafter`
wrote: the trtllm-build command (explicit_draft_tokens, K = beams x length as TensorRT-LLM's builder sets it), the
manifest's `redrafter` section, the repository's decoding_mode, doctor's cross-checks, and the CPU runtime's one-line
refusal of a TensorRT-LLM engine (the CPU engine: tests/runtime/test_redrafter_cpu.py). Upstream files: docs/upstream-sources.md (ReDrafter)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.checkpoint.convert import ConvertOptions, convert
from trtspec.cli import cli
from trtspec.engine.manifest import Manifest, Method, read_manifest
from trtspec.engine.trtllm_builder import build
from trtspec.engine.trtllm_plan import Lookahead, SpecMode, TrtllmBuildOptions, plan_trtllm_build
from trtspec.errors import BuildError, ConfigError
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.doctor import doctor

BEAMS, LENGTH = 4, 3  # K = 12


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """ReDrafter checkpoints over a tiny LLaMA (float16, 4 beams x 3 tokens; TensorRT-LLM 1.2's names and 0.21's)
    and a Qwen2 base (defaults: 5 x 5), with a tokenizer."""
    from trtspec.testing import TinyModel, write_hf_base, write_redrafter_drafter, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("redrafter")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    llama, qwen = TinyModel(vocab_size=vocab), TinyModel(vocab_size=vocab, arch="qwen2")
    base, drafter = write_hf_base(root / "base", llama), write_redrafter_drafter(root / "drafter", llama, exit_dim=96)
    out = {"tokenizer": root / "tokenizer", "drafter": drafter}
    beams = {"redrafter_num_beams": BEAMS, "redrafter_draft_len_per_beam": LENGTH, "dtype": "float16"}
    for name, version in (("llama", None), ("llama-0.21", "0.21")):
        convert(ConvertOptions(base=base, out=root / name, redrafter=drafter, trtllm_version=version, **beams),
                show_progress=False)
        out[name] = root / name
    convert(ConvertOptions(base=write_hf_base(root / "qwen-base", qwen), out=root / "qwen", dtype="float16",
                           redrafter=write_redrafter_drafter(root / "qwen-drafter", qwen)), show_progress=False)
    out["qwen"] = root / "qwen"
    return out


def options(ckpt, out, **kwargs):
    return TrtllmBuildOptions(source=ckpt, out=out, **{"max_input_len": 128, "max_batch_size": 4,
                                                       "trtllm_version": "1.2", **kwargs})


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---- the plan --------------------------------------------------------------------------------------------

def test_the_plan_builds_explicit_draft_tokens_with_k_beams_times_length(tiny, tmp_path):
    p = plan_trtllm_build(options(tiny["llama"], tmp_path / "e"))
    # examples/redrafter/README.md's command, with K as tensorrt_llm/builder.py sets it (beams x length)
    assert list(p.argv) == [
        "trtllm-build", "--checkpoint_dir", str(tiny["llama"]), "--output_dir", str(tmp_path / "e"),
        "--gemm_plugin", "float16", "--speculative_decoding_mode", "explicit_draft_tokens", "--max_draft_len", "12",
        "--max_batch_size", "4", "--max_input_len", "128", "--max_seq_len", "256", "--max_num_tokens", "1024",
        "--use_paged_context_fmha", "enable"]
    assert p.build_config == {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256 + 12,
                              "max_num_tokens": 1024, "max_draft_len": 12, "speculative_decoding_mode": 16,
                              "max_beam_width": 1, "plugin_config": {"use_paged_context_fmha": True}}
    assert SpecMode.EXPLICIT_DRAFT_TOKENS.bit == 16  # tensorrt_llm/models/modeling_utils.py SpeculativeDecodingMode
    # the C++ runtime's K is the product of these two (gptJsonConfig.cpp)
    assert p.pretrained_config == {"architecture": "ReDrafterForLLaMALM", "dtype": "float16",
                                   "vocab_size": p.manifest.model.vocab_size, "redrafter_num_beams": BEAMS,
                                   "redrafter_draft_len_per_beam": LENGTH}
    assert p.runtime == {"decoding_mode": "redrafter", "tokens_per_step": 13, "world_size": 1,
                         "redrafter_num_beams": BEAMS, "redrafter_draft_len_per_beam": LENGTH,
                         "redrafter_greedy_search": True}
    assert p.checkpoint_view is None and p.quantization is None  # trtllm-build reads the checkpoint as it is
    assert p.engine_config["pretrained_config"]["base_model_architecture"] == "LlamaForCausalLM"


def test_the_manifest_records_method_redrafter_and_its_beams(tiny, tmp_path):
    m = plan_trtllm_build(options(tiny["llama"], tmp_path / "e")).manifest
    assert (m.method, m.redrafter, m.tree, m.lookahead) == (
        Method.REDRAFTER, {"num_beams": BEAMS, "draft_len_per_beam": LENGTH, "greedy_search": True}, None, None)
    assert (m.profile.max_draft_len, m.profile.slot_profiles) == (12, (13,))
    assert Manifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m
    assert m.model.architecture == "ReDrafterForLLaMALM" and m.model.hidden_size == 64  # the base's shape


def test_a_qwen_base_and_upstreams_default_beams(tiny, tmp_path):
    p = plan_trtllm_build(options(tiny["qwen"], tmp_path / "e"))
    assert p.build_config["max_draft_len"] == 25 and p.manifest.redrafter["num_beams"] == 5  # 5 x 5, the defaults
    assert p.pretrained_config["architecture"] == "ReDrafterForQWenLM" and p.manifest.model.qkv_bias
    assert not p.manifest.model.o_bias  # Qwen2: biases on q/k/v only, read through base_model_architecture


def test_the_checkpoints_names_are_the_versions(tiny, tmp_path):
    """ReDrafterForCausalLM up to 0.21, one class per base family from 1.0 (MODEL_MAP, where trtllm-build looks)."""
    assert plan_trtllm_build(options(tiny["llama-0.21"], tmp_path / "e", trtllm_version="0.21")).manifest.method \
        is Method.REDRAFTER
    with pytest.raises(BuildError) as new:
        plan_trtllm_build(options(tiny["llama-0.21"], tmp_path / "e"))
    assert str(new.value) == (
        f"{tiny['llama-0.21'] / 'config.json'}: architecture ReDrafterForCausalLM is not a name TensorRT-LLM 1.2 has "
        "(it calls a ReDrafter LlamaForCausalLM checkpoint ReDrafterForLLaMALM, trtllm-build looks it up in "
        "MODEL_MAP); reconvert with `trtspec convert --redrafter DIR --trtllm-version 1.2`, or build for the "
        "checkpoint's release (--trtllm-version 0.21)")
    with pytest.raises(BuildError, match="ReDrafterForLLaMALM is not a name TensorRT-LLM 0.21 has .* checkpoint ReDrafterForCausalLM, .*"
                                         r"--trtllm-version 0.21`, .*\(--trtllm-version 1.0\)$"):
        plan_trtllm_build(options(tiny["llama"], tmp_path / "e", trtllm_version="0.21"))
    with pytest.raises(BuildError, match=r"ReDrafter over LLaMA bases only .* needs 1.0 or later .*0.21, the build"):
        plan_trtllm_build(options(tiny["qwen"], tmp_path / "e", trtllm_version="0.21"))


REFUSALS = {
    "max-draft-len": ({"max_draft_len": 5}, "a ReDrafter engine's max_draft_len is redrafter_num_beams x "
                                           "redrafter_draft_len_per_beam = 4 x 3 = 12"),
    "no-spec": ({"no_spec": True}, "--no-spec does not apply to a ReDrafter checkpoint"),
    "choices": ({"choices": "[[0]]"}, "--choices does not apply to a ReDrafter checkpoint"),
    "lookahead": ({"lookahead": Lookahead(2, 2, 1)}, "--lookahead does not apply"),
    "draft-target": ({"draft_target": True, "max_draft_len": 12}, "--draft-target does not apply"),
    "weights": ({"weights": "int8"}, "quantize.py takes no ReDrafter drafter"),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_what_a_redrafter_build_refuses_in_one_line(tiny, tmp_path, case):
    kwargs, words = REFUSALS[case]
    with pytest.raises((BuildError, ConfigError)) as error:
        plan_trtllm_build(options(tiny["llama"], tmp_path / "e", **kwargs))
    assert words in str(error.value) and "\n" not in str(error.value)
    assert plan_trtllm_build(options(tiny["llama"], tmp_path / "e", max_draft_len=12)).build_config[
        "max_draft_len"] == 12  # the K it has anyway may be named


def test_the_onnx_backend_takes_the_beams_as_k(tiny, tmp_path):
    """A CPU build's K is the checkpoint's beams x draft length; a smaller --max-draft-len is one line."""
    result = run("build", tiny["llama"], "--out", tmp_path / "e", "--max-draft-len", "5")
    assert result.exit_code == 1 and not (tmp_path / "e").exists()
    assert result.output.strip() == ("error: --max-draft-len 5 is smaller than the 4 beams x 3 draft tokens (the "
                                     "checkpoint's redrafter_num_beams, redrafter_draft_len_per_beam); pass "
                                     "--max-draft-len 12 or convert with fewer --redrafter-num-beams / "
                                     "--redrafter-draft-len-per-beam")


def test_dry_run_prints_the_command_and_the_beams(tiny, tmp_path):
    result = run("build", tiny["llama"], "--backend", "trtllm", "--dry-run", "--out", tmp_path / "e",
                 "--max-input-len", "128", "--trtllm-version", "1.2")
    assert result.exit_code == 0, result.output
    assert "--speculative_decoding_mode explicit_draft_tokens --max_draft_len 12" in result.stdout
    assert re.search(r"decoding_mode +redrafter\n", result.stdout)
    assert re.search(r"redrafter_num_beams +4\n", result.stdout)


# ---- the method ------------------------------------------------------------------------------------------

def test_the_method_is_trained_built_into_engines_and_decoded_on_the_cpu():
    r = Method.REDRAFTER
    assert r.value == "redrafter" and r.trained and not r.training_free
    assert r in Method.built_into_engines() and r in Method.decoded_on_cpu()
    assert r in Method.recipe_drafters()  # a recipe converts ReDrafter drafters (drafter.kind redrafter)


def test_the_manifests_redrafter_section_is_checked(tiny, tmp_path):
    m = plan_trtllm_build(options(tiny["llama"], tmp_path / "e")).manifest.to_dict()
    with pytest.raises(ConfigError, match=r"^manifest.json: redrafter num_beams 4 x draft_len_per_beam 2 = 8, but "
                                          r"the profile's max_draft_len is 12$"):
        Manifest.from_dict({**m, "redrafter": {**m["redrafter"], "draft_len_per_beam": 2}})
    with pytest.raises(ConfigError, match="method redrafter with redrafter None; a redrafter engine records"):
        Manifest.from_dict({**m, "redrafter": None})
    with pytest.raises(ConfigError, match="manifest.json: redrafter: unknown key 'beams'"):
        Manifest.from_dict({**m, "redrafter": {"beams": 4}})
    with pytest.raises(ConfigError, match="redrafter num_beams must be a positive integer, found 0"):
        Manifest.from_dict({**m, "redrafter": {**m["redrafter"], "num_beams": 0}})
    # every method's manifest holds the key (null but for ReDrafter's): one without it is incomplete
    plain = plan_trtllm_build(options(tiny["llama"], tmp_path / "p", trtllm_version="1.2")).manifest.to_dict()
    plain = {**plain, "method": "none", "redrafter": None}
    plain["profile"] = {**plain["profile"], "max_draft_len": 0, "slot_profiles": []}
    assert Manifest.from_dict(plain).redrafter is None
    del plain["redrafter"]
    with pytest.raises(ConfigError, match="missing key 'redrafter'"):
        Manifest.from_dict(plain)


# ---- build (the stand-in trtllm-build), deploy, doctor --------------------------------------------------

@pytest.fixture(scope="module")
def engines(tiny, tmp_path_factory, fake_build):
    """A planned ReDrafter engine, the same built by the stand-in, and each deployed."""
    root = tmp_path_factory.mktemp("redrafter-engines")
    opts = {name: options(tiny["llama"], root / name, tokenizer=tiny["tokenizer"]) for name in ("planned", "built")}
    from trtspec.engine.trtllm_builder import write_plan

    write_plan(opts["planned"])
    build(opts["built"], runner=lambda argv, cwd: fake_build(argv, cwd, version="1.2.1"))
    for name in opts:
        deploy(DeployOptions(engine_dir=root / name, out=root / f"repo-{name}"))
    return root


def test_the_built_engine_is_adopted_with_its_manifest(engines):
    m = read_manifest(engines / "built")
    assert m.method is Method.REDRAFTER and m.files == {"config": "config.json", "rank0": "rank0.engine"}
    config = json.loads((engines / "built" / "config.json").read_text())
    assert (config["build_config"]["speculative_decoding_mode"], config["build_config"]["max_draft_len"]) == (16, 12)


def _params(path: Path) -> dict[str, str]:
    """A config.pbtxt's parameters, parsed by Triton's protobuf."""
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    config = json_format.MessageToDict(text_format.Parse(path.read_text(), model_config_pb2.ModelConfig()))
    return {k: v["stringValue"] for k, v in config.get("parameters", {}).items()}


@pytest.mark.parametrize("name", ["planned", "built"])
def test_the_repository_decodes_redrafter(engines, name):
    repo = engines / f"repo-{name}"
    llm = _params(repo / "tensorrt_llm" / "config.pbtxt")
    assert llm["decoding_mode"] == "redrafter"  # model_instance_state.cc: ExplicitDraftTokens
    assert llm["gpt_model_path"] == str((engines / name).resolve()) and llm["max_beam_width"] == "1"
    assert not {k for k in llm if k.endswith("_choices") or k.startswith("lookahead_")}  # the engine drafts itself
    assert _params(repo / "tensorrt_llm_bls" / "config.pbtxt")["max_draft_len"] == "12"
    assert not any("${" in p.read_text() for p in repo.glob("*/config.pbtxt"))
    assert "(redrafter, TensorRT-LLM 1.2" in (repo / "launch_triton.sh").read_text()


def _set_param(repo: Path, key: str, value: str | None) -> None:
    path = repo / "tensorrt_llm" / "config.pbtxt"
    block = re.compile(r'parameters \{\n  key: "' + re.escape(key) + r'"\n.*?\n\}\n', re.S)
    new = f'parameters {{\n  key: "{key}"\n  value: {{ string_value: "{value}" }}\n}}\n' if value is not None else ""
    path.write_text(block.sub(new, path.read_text()))


def _problems(findings) -> list[str]:
    return [str(f) for f in findings if f.severity != "note"]


def _errors(findings) -> list[str]:  # (the copied engine is not the repository's gpt_model_path: a warning)
    return [str(f) for f in findings if f.severity == "error"]


def test_doctor_finds_nothing_wrong_with_what_trtspec_wrote(engines):
    assert _problems(doctor(engines / "repo-built")) == []
    [planned] = _problems(doctor(engines / "repo-planned"))  # only the engine files still to come
    assert planned.startswith("warning: tensorrt_llm: engine files: ") and "explicit_draft_tokens" in planned


DOCTOR_CASES = {
    "top_k_top_p": ("top_k_top_p", "error: tensorrt_llm: decoding_mode: 'top_k_top_p' on a redrafter engine (built "
                                   "with speculative_decoding_mode explicit_draft_tokens, which decoding_mode "
                                   "'redrafter' decodes); set 'redrafter'"),
    "medusa": ("medusa", "error: tensorrt_llm: decoding_mode: 'medusa' on a redrafter engine (built with "
                         "speculative_decoding_mode explicit_draft_tokens, which decoding_mode 'redrafter' decodes); "
                         "set 'redrafter'"),
    "unset": (None, "warning: tensorrt_llm: decoding_mode: unset on a redrafter engine: TensorRT-LLM switches with "
                    "only a warning; set 'redrafter'"),
}


@pytest.mark.parametrize("name", ["planned", "built"])
@pytest.mark.parametrize("case", DOCTOR_CASES)
def test_doctor_cross_checks_decoding_mode_with_the_engine(engines, tmp_path, name, case):
    value, line = DOCTOR_CASES[case]
    repo = tmp_path / "repo"
    shutil.copytree(engines / f"repo-{name}", repo)
    _set_param(repo, "decoding_mode", value)
    assert line in _problems(doctor(repo))
    assert sum(f.field == "decoding_mode" for f in doctor(repo)) == 1  # one line


def test_doctor_refuses_redrafter_decoding_on_another_engine(engines, tmp_path, tiny, fake_build, write_ckpt):
    plain = write_ckpt(tmp_path, "vicuna-7b", weights=True)
    build(TrtllmBuildOptions(source=plain, out=tmp_path / "plain", tokenizer=tiny["tokenizer"], trtllm_version="1.2",
                             max_batch_size=4), runner=lambda argv, cwd: fake_build(argv, cwd))
    deploy(DeployOptions(engine_dir=tmp_path / "plain", out=tmp_path / "repo"))
    _set_param(tmp_path / "repo", "decoding_mode", "redrafter")
    assert _problems(doctor(tmp_path / "repo")) == [
        "error: tensorrt_llm: decoding_mode: 'redrafter' but the engine was built with speculative_decoding_mode "
        "none ('redrafter' decodes an engine built with explicit_draft_tokens, from a ReDrafter checkpoint)"]


def test_doctor_checks_the_engine_against_its_manifest(engines, tmp_path):
    engine, repo = tmp_path / "engine", tmp_path / "repo"
    shutil.copytree(engines / "built", engine)
    shutil.copytree(engines / "repo-built", repo)
    path = engine / "config.json"
    good = json.loads(path.read_text())
    # an engine built by hand from a checkpoint with other beams
    path.write_text(json.dumps({**good, "pretrained_config": {**good["pretrained_config"], "redrafter_num_beams": 2}}))
    assert _errors(doctor(repo, engine)) == [
        "error: tensorrt_llm: redrafter: the engine's config.json has redrafter_num_beams x "
        "redrafter_draft_len_per_beam = 2 x 3, its manifest.json 4 x 3: the engine is not the one trtspec planned; "
        "rebuild it with `trtspec build`"]
    # an engine built without explicit_draft_tokens where the manifest says redrafter
    build_config = {**good["build_config"], "speculative_decoding_mode": 1, "max_draft_len": 0}
    path.write_text(json.dumps({**good, "build_config": build_config}))
    found = _errors(doctor(repo, engine))
    assert f"error: tensorrt_llm: speculative_decoding_mode: the engine {engine} was built with none, its " \
           "manifest.json says method redrafter (explicit_draft_tokens is method redrafter): the engine is not the " \
           "one trtspec planned; rebuild it with `trtspec build`" in found
    assert "error: tensorrt_llm: decoding_mode: 'redrafter' but the engine was built with speculative_decoding_mode " \
           "none ('redrafter' decodes an engine built with explicit_draft_tokens, from a ReDrafter checkpoint)" in found


# ---- the CPU runtime refuses the TensorRT-LLM engine --------------------------------------------------

@pytest.mark.parametrize("name", ["planned", "built"])
def test_generate_refuses_a_redrafter_engine_in_one_line(engines, name):
    engine = engines / name
    result = run("generate", engine, "--prompt", "hello", "--max-tokens", "4")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip() == (
        f"error: {engine}: a TensorRT-LLM redrafter engine runs on a GPU host with TensorRT-LLM, not on trtspec's CPU "
        f"runtime; serve it there (`trtspec deploy {engine} --flavour trtllm`) and query it with "
        "`trtspec generate --url HOST`")


def test_inspect_shows_the_beams(engines):
    result = run("inspect", engines / "built")
    assert result.exit_code == 0, result.output
    assert re.search(r"redrafter +4 beams x 3 draft tokens, greedy beam search", result.output)
