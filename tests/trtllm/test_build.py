"""`build --backend trtllm` around trtllm-build: the engine dir it leaves, the check of the engine config.json
against the plan, adoption of a hand-run build. trtllm-build itself is a stand-in here (conftest): it applies
builder.build()'s documented adjustments to the flags it gets. The real build is the GPU test below."""

from __future__ import annotations

import json
import re

import pytest

from trtspec.engine.manifest import read_manifest
from trtspec.engine.trtllm_builder import build, trtllm_available
from trtspec.engine.trtllm_plan import Lookahead, TrtllmBuildOptions
from trtspec.errors import BuildError


def options(ckpt, out, tokenizer, **kwargs):
    return TrtllmBuildOptions(source=ckpt, out=out, tokenizer=tokenizer,
                              **{"max_batch_size": 4, "trtllm_version": "1.2", **kwargs})


def test_engine_dir_has_the_cpu_backends_layout(checkpoints, tokenizer_dir, tmp_path, fake_build):
    out = tmp_path / "engine"
    manifest = build(options(checkpoints["llama-3.1-8b"], out, tokenizer_dir, lookahead=Lookahead(7, 7, 7)),
                     runner=lambda argv, cwd: fake_build(argv, cwd, version="1.2.1"))
    assert read_manifest(out) == manifest
    assert manifest.files == {"config": "config.json", "rank0": "rank0.engine"}
    assert (manifest.backend.value, manifest.method.value, manifest.tokenizer) == ("trtllm", "lookahead", "tokenizer")
    assert manifest.versions["tensorrt_llm"] == "1.2.1" and manifest.model.end_id == 2
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]  # no staging dirs left


def test_argv_gets_the_staging_dir_and_tp_ranks_are_checked(write_ckpt, tokenizer_dir, tmp_path, fake_build):
    ckpt = write_ckpt(tmp_path, "vicuna-7b-medusa", weights=True,
                      mapping={"world_size": 2, "tp_size": 2, "pp_size": 1})
    seen = {}

    def runner(argv, cwd):
        seen["out"] = argv[argv.index("--output_dir") + 1]
        fake_build(argv, cwd)

    manifest = build(options(ckpt, tmp_path / "engine", tokenizer_dir), runner=runner)
    assert seen["out"] != str(tmp_path / "engine") and (manifest.tp_size, manifest.world_size) == (2, 2)
    assert set(manifest.files) == {"config", "rank0", "rank1"}
    (ckpt / "rank1.safetensors").unlink()
    with pytest.raises(BuildError, match="rank1.safetensors is missing"):
        build(options(ckpt, tmp_path / "engine2", tokenizer_dir), runner=runner)


@pytest.mark.parametrize("name,kwargs,tamper,message", [
    # tensorrtllm_backend#473: a target that was not built for external draft tokens
    ("llama-3.1-8b", {"draft_target": True, "max_draft_len": 10},
     lambda c: c["build_config"].update(speculative_decoding_mode=1, max_draft_len=0),
     "build_config.max_draft_len=0 but the plan asked for 10"),
    # TensorRT-LLM tensorrt_llm/builder.py Engine.save: the Medusa runtime reads pretrained_config.max_draft_len
    ("vicuna-7b-medusa", {}, lambda c: c["pretrained_config"].update(max_draft_len=8),
     "pretrained_config.max_draft_len=8 but the plan asked for 63"),
    ("vicuna-7b-eagle", {}, lambda c: c["build_config"]["plugin_config"].update(use_paged_context_fmha=False),
     "build_config.plugin_config.use_paged_context_fmha=False"),
    ("vicuna-7b-medusa", {}, lambda c: c["build_config"].update(max_num_tokens=100),
     "build_config.max_num_tokens=100, planned 8192 (at least 256)"),
    ("vicuna-7b-medusa", {}, lambda c: c.update(version="0.17.0"),
     "the engine was built by TensorRT-LLM 0.17.0, the plan targets 1.2"),
])
def test_engine_config_is_checked_against_the_plan(checkpoints, tokenizer_dir, tmp_path, fake_build, name, kwargs,
                                                   tamper, message):
    with pytest.raises(BuildError, match=re.escape(message)):
        build(options(checkpoints[name], tmp_path / "engine", tokenizer_dir, **kwargs),
              runner=lambda argv, cwd: fake_build(argv, cwd, tamper=tamper))
    assert not (tmp_path / "engine").exists()


def test_a_hand_run_build_is_adopted(checkpoints, tokenizer_dir, tmp_path, fake_build):
    from trtspec.engine.trtllm_plan import plan_trtllm_build

    opts = options(checkpoints["vicuna-7b-eagle"], tmp_path / "engine", tokenizer_dir)
    (tmp_path / "engine").mkdir()
    fake_build(plan_trtllm_build(opts).argv, tmp_path, version="1.2.0")  # the printed command, run by hand
    manifest = build(opts)
    assert read_manifest(tmp_path / "engine") == manifest and manifest.method.value == "eagle"


def test_version_mismatch_with_the_installed_package(checkpoints, tokenizer_dir, tmp_path, monkeypatch):
    import trtspec.engine.trtllm_builder as builder

    monkeypatch.setattr(builder, "trtllm_available", lambda: True)
    monkeypatch.setattr(builder, "installed_version", lambda: "0.17.0")
    with pytest.raises(BuildError, match=re.escape("tensorrt_llm 0.17.0 is installed but the plan targets 1.2")):
        build(options(checkpoints["vicuna-7b"], tmp_path / "engine", tokenizer_dir))


@pytest.mark.gpu
@pytest.mark.skipif(not trtllm_available(), reason="needs tensorrt_llm and trtllm-build (an NVIDIA GPU host)")
def test_real_trtllm_build_of_a_tiny_medusa_checkpoint(tmp_path):
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

    model = TinyModel(dtype="float16", hidden_size=256, num_heads=4, num_kv_heads=4, intermediate_size=512,
                      vocab_size=512)  # head size 64: one the spec-decoding attention kernels take
    ckpt = tiny_trtllm_checkpoints(tmp_path, model, drafters=("medusa",), max_draft_len=7)["medusa"]
    manifest = build(TrtllmBuildOptions(source=ckpt, out=tmp_path / "engine", preset="chain_3", max_batch_size=2,
                                        max_input_len=64, max_seq_len=128))
    config = json.loads((tmp_path / "engine" / "config.json").read_text())
    # K follows the 3-node tree (the checkpoint says 7): trtllm-build read the checkpoint view, config.json with K = 3
    assert config["build_config"]["max_draft_len"] == config["pretrained_config"]["max_draft_len"] == 3
    assert manifest.profile.max_draft_len == 3 and (tmp_path / "engine" / "checkpoint" / "config.json").is_file()
    assert read_manifest(tmp_path / "engine") == manifest
