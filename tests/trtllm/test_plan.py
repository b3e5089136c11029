"""`trtspec build --backend trtllm` plans: golden flag values and derived numbers from the reference, and the
engine-flow constraints, each rejected before anything runs."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.manifest import Manifest
from trtspec.engine.trtllm_plan import Lookahead, TrtllmBuildOptions, cpp_choices, plan_trtllm_build
from trtspec.errors import BuildError, ConfigError
from trtspec.speculative.tree import parse_choices
from trtspec.speculative.tree_presets import preset


def plan(ckpt, tmp_path, **kwargs):
    return plan_trtllm_build(TrtllmBuildOptions(source=ckpt, out=tmp_path / "engine",
                                                **{"max_batch_size": 4, "trtllm_version": "1.2", **kwargs}))


def flags(p) -> dict[str, str]:
    return dict(zip(p.argv[1::2], p.argv[2::2]))


def test_vicuna_7b_medusa_63_node_tree(checkpoints, tmp_path):
    p = plan(checkpoints["vicuna-7b-medusa"], tmp_path)
    assert p.argv == ("trtllm-build", "--checkpoint_dir", str(checkpoints["vicuna-7b-medusa"]),
                      "--output_dir", str(tmp_path / "engine"), "--gemm_plugin", "float16",
                      "--speculative_decoding_mode", "medusa", "--max_draft_len", "63", "--max_batch_size", "4",
                      "--max_input_len", "1024", "--max_seq_len", "2048", "--max_num_tokens", "8192",
                      "--use_paged_context_fmha", "enable")
    # TensorRT-LLM tensorrt_llm/runtime/medusa_utils.py worked outputs for mc_sim_7b_63; TensorRT-LLM tensorrt_llm/builder.py: max_seq_len and max_num_tokens grow with the draft, Medusa reads pretrained_config
    assert {k: p.runtime[k] for k in ("tree_nodes", "tree_depth", "topks", "paths", "packed_mask_words",
                                      "tokens_per_step", "decoding_mode")} == {
        "tree_nodes": 63, "tree_depth": 4, "topks": [10, 10, 10, 2], "paths": 42, "packed_mask_words": 2,
        "tokens_per_step": 64, "decoding_mode": "medusa"}
    assert max(p.runtime["non_leaves_per_level"]) == 10
    assert p.build_config == {"max_batch_size": 4, "max_input_len": 1024, "max_seq_len": 2048 + 63,
                              "max_num_tokens": 8192, "max_draft_len": 63, "speculative_decoding_mode": 4,
                              "max_beam_width": 1, "plugin_config": {"use_paged_context_fmha": True}}
    assert p.pretrained_config["max_draft_len"] == 63 and p.pretrained_config["num_medusa_heads"] == 4
    # C++ brace syntax (tensorrtllm_backend tensorrt_llm/config.pbtxt), every node of the published tree
    choices = p.runtime["medusa_choices"]
    assert choices.startswith("{0}, {1}, {2}") and "[" not in choices
    assert sorted(map(tuple, parse_choices(choices))) == sorted(map(tuple, preset("mc_sim_7b_63")))
    assert Manifest.from_dict(p.manifest.to_dict()) == p.manifest
    assert (p.manifest.method.value, p.manifest.profile.tokens_per_step, p.manifest.profile.max_seq_len) == \
        ("medusa", 64, 2111)


ONE_PROFILE = ("one generation-step profile of max_draft_len + 1 tokens: on a GPU a verify step costs about the "
               "same at any token count up to it, so TensorRT-LLM pads every draft to it (the onnx backend carries "
               "several slot profiles instead, because a CPU's verify step grows with its slots)")


def test_vicuna_7b_eagle(checkpoints, tmp_path):
    p = plan(checkpoints["vicuna-7b-eagle"], tmp_path)
    f = flags(p)
    assert (f["--speculative_decoding_mode"], f["--max_draft_len"], f["--use_paged_context_fmha"]) == \
        ("eagle", "63", "enable")  # EAGLE requires paged context FMHA (TensorRT-LLM tensorrt_llm/builder.py)
    assert p.build_config["max_seq_len"] == 2048 + 63 + 4  # + max_draft_len + num_eagle_layers (TensorRT-LLM tensorrt_llm/builder.py)
    assert p.build_config["speculative_decoding_mode"] == 32
    assert (p.runtime["tree_depth"], p.runtime["decoding_mode"]) == (4, "eagle")  # depth == num_eagle_layers
    # TensorRT-LLM tensorrt_llm/models/eagle/model.py sizes the draft inputs by pretrained_config.max_draft_len
    assert p.pretrained_config == {"architecture": "EagleForCausalLM", "dtype": "float16", "vocab_size": 32000,
                                   "max_draft_len": 63, "num_eagle_layers": 4, "max_non_leaves_per_layer": 10}
    assert p.runtime["eagle_choices"] == cpp_choices(p.manifest.tree)
    assert p.notes == (ONE_PROFILE,)  # says why a TensorRT-LLM engine keeps one max_draft_len


def test_a_draft_vocabulary_beside_the_rank_files_is_noted_not_silently_dropped(checkpoints, tmp_path):
    import shutil

    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["vicuna-7b-eagle"], ckpt)
    (ckpt / "draft_vocab.safetensors").write_bytes(b"")  # only its presence matters to the plan
    p = plan(ckpt, tmp_path)
    assert p.notes == (ONE_PROFILE, f"{ckpt / 'draft_vocab.safetensors'}: TensorRT-LLM's EAGLE-1 engine has no "
                       "reduced draft vocabulary, so its draft scores the whole vocabulary (same outputs; a larger "
                       "draft lm_head)")
    assert p.to_dict()["notes"] == list(p.notes)
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--backend", "trtllm", "--dry-run", "--out",
                                      str(tmp_path / "engine"), "--trtllm-version", "1.2"])
    assert result.exit_code == 0 and all(f"note: {note}" in result.output for note in p.notes)


def test_llama_31_8b_lookahead_777(checkpoints, tmp_path):
    p = plan(checkpoints["llama-3.1-8b"], tmp_path, lookahead=Lookahead(7, 7, 7))
    f = flags(p)
    # (N-2) + (W-1+G)(N-1) = 5 + 13*6 = 83: the --max_draft_len 83 of TensorRT-LLM's examples/lookahead/README.md
    assert (f["--speculative_decoding_mode"], f["--max_draft_len"], f["--gemm_plugin"]) == \
        ("lookahead_decoding", "83", "bfloat16")
    assert p.runtime["lookahead"] == {"window_size": 7, "ngram_size": 7, "verification_set_size": 7,
                                      "max_decoding_tokens": 84, "max_path_len": 7, "max_draft_tokens": 83,
                                      "max_draft_path_len": 6}
    assert (p.runtime["packed_mask_words"], p.build_config["speculative_decoding_mode"]) == (3, 8)
    assert p.manifest.lookahead == {"window_size": 7, "ngram_size": 7, "verification_set_size": 7}
    assert Lookahead(4, 3, 4).max_draft_len == 15  # the executor defaults (TensorRT-LLM tensorrt_llm/llmapi/llm_args.py)


def test_draft_target_pair(checkpoints, tmp_path):
    target = plan(checkpoints["llama-3.1-8b"], tmp_path, draft_target=True, max_draft_len=10)
    draft = plan(checkpoints["llama-3.2-1b"], tmp_path)
    f = flags(target)
    assert (f["--speculative_decoding_mode"], f["--max_draft_len"], f["--use_paged_context_fmha"]) == \
        ("draft_tokens_external", "10", "enable")
    assert target.build_config["max_num_tokens"] >= 4 * 11 and target.build_config["speculative_decoding_mode"] == 2
    assert target.runtime == {"decoding_mode": "top_k_top_p", "tokens_per_step": 11, "world_size": 1,
                              "num_draft_tokens": 10}
    # the draft is a plain engine; paged context FMHA for KV reuse (tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md)
    assert "--speculative_decoding_mode" not in draft.argv and flags(draft)["--use_paged_context_fmha"] == "enable"
    assert draft.manifest.model.vocab_size == target.manifest.model.vocab_size == 128256


def test_max_num_tokens_covers_every_slot(checkpoints, tmp_path):
    p = plan(checkpoints["vicuna-7b-medusa"], tmp_path, max_batch_size=256, max_input_len=256, max_seq_len=512)
    assert p.build_config["max_num_tokens"] == 256 * 64  # raised to batch * (K+1), as TensorRT-LLM tensorrt_llm/builder.py raises it


def test_llama3_rope_scaling_keeps_the_position_limit(checkpoints, tmp_path):
    assert plan(checkpoints["llama-3.1-8b"], tmp_path, max_seq_len=131072).build_config["max_seq_len"] == 131072
    with pytest.raises(BuildError, match="max_position_embeddings=131072"):
        plan(checkpoints["llama-3.1-8b"], tmp_path, max_seq_len=131073)


@pytest.mark.parametrize("name,overrides,kwargs,error,message", [
    ("vicuna-7b-medusa", {}, {"max_draft_len": 31}, BuildError,
     "the tree has 63 nodes but --max-draft-len is 31; leave --max-draft-len out (K follows the tree)"),
    ("vicuna-7b-medusa", {}, {"choices": "[[0],[0,0],[0,0,0],[0,0,0,0],[0,0,0,0,0]]"}, BuildError,
     "tree depth 5 exceeds the 4 Medusa heads (one per level); pass a tree at most 4 deep (--choices / --preset)"),
    ("vicuna-7b-medusa", {}, {"max_draft_len": 64}, BuildError,
     "max_draft_len 64 is a multiple of 32"),
    ("vicuna-7b-eagle", {}, {"preset": "eagle_25"}, BuildError,
     "EAGLE-1 needs tree depth == num_eagle_layers = 4, but the tree has depth 5; pass a tree 4 deep"),
    ("vicuna-7b-eagle", {"max_non_leaves_per_layer": 5}, {"preset": "mc_sim_7b_63"}, BuildError,
     "has 10 non-leaf nodes, above the checkpoint's max_non_leaves_per_layer 5"),
    ("vicuna-7b-eagle", {}, {"max_draft_len": 50}, BuildError, "the tree has 63 nodes but --max-draft-len is 50"),
    ("vicuna-7b-eagle", {}, {"max_batch_size": 600}, BuildError, "--max-batch-size <= 512"),
    ("vicuna-7b-eagle", {}, {"max_draft_len": 300}, BuildError, "max_draft_len <= 256"),
    ("vicuna-7b-eagle", {"mapping": {"world_size": 2, "tp_size": 1, "pp_size": 2}}, {}, BuildError,
     "EAGLE does not support pipeline parallelism"),
    ("llama-3.1-8b", {}, {"lookahead": Lookahead(7, 7, 7), "max_draft_len": 63}, BuildError,
     "needs max_draft_len == (N-2)+(W-1+G)(N-1) = 83"),
    ("vicuna-7b-medusa", {}, {"lookahead": Lookahead(4, 3, 4)}, BuildError, "--lookahead needs a plain checkpoint"),
    ("llama-3.1-8b", {}, {"draft_target": True}, BuildError, "--draft-target needs --max-draft-len K"),
    ("llama-3.1-8b", {}, {"draft_target": True, "max_draft_len": 10, "max_num_tokens": 40}, BuildError,
     "--max-num-tokens 40 is below max_batch_size * (max_draft_len + 1) = 4 * 11 = 44"),
    ("vicuna-7b", {}, {"max_seq_len": 4096}, BuildError, "exceeds what"),
    ("vicuna-7b", {}, {"preset": "chain_2"}, BuildError, "has no drafter"),
    ("vicuna-7b", {}, {"max_draft_len": 4}, BuildError, "--max-draft-len 4 needs a speculative method"),
    ("vicuna-7b", {}, {"trtllm_version": "0.14"}, ConfigError, "outside the TensorRT-LLM engine flow"),
    ("vicuna-7b", {}, {"trtllm_version": "latest"}, ConfigError, "is not a version"),
    ("vicuna-7b", {}, {"max_input_len": 2048, "max_seq_len": 2048}, ConfigError, "leaves no room to generate"),
])
def test_constraints_are_checked_before_anything_runs(write_ckpt, tmp_path, name, overrides, kwargs, error,
                                                      message):
    ckpt = write_ckpt(tmp_path, name, **overrides)
    with pytest.raises(error, match=re.escape(message)):
        plan(ckpt, tmp_path, **kwargs)


def test_lookahead_rejects_configs_that_draft_nothing():
    with pytest.raises(ConfigError, match=re.escape("smallest meaningful (W,N,G) is 2,2,1")):
        Lookahead(1, 1, 0)
    with pytest.raises(ConfigError, match="three integers"):
        Lookahead.parse("7,7")


def test_hugging_face_folder_says_convert_first(tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(BuildError, match="run `trtspec convert"):
        plan(tmp_path / "hf", tmp_path)


# ---- through the CLI ------------------------------------------------------------------------------------

def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_cli_dry_run_json_is_the_plan(checkpoints, tmp_path):
    result = run("build", checkpoints["llama-3.1-8b"], "--backend", "trtllm", "--out", tmp_path / "e",
                 "--lookahead", "7,7,7", "--max-batch-size", "4", "--trtllm-version", "0.19", "--dry-run", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["command"][0] == "trtllm-build" and out["build_config"]["max_draft_len"] == 83
    assert out["trtllm_version"] == "0.19" and out["manifest"]["backend"] == "trtllm"
    assert out["command_line"].startswith("trtllm-build --checkpoint_dir ")
    assert not (tmp_path / "e").exists()


def test_cli_without_tensorrt_llm_prints_the_command_and_stops(checkpoints, tmp_path):
    result = run("build", checkpoints["vicuna-7b-medusa"], "--backend", "trtllm", "--out", tmp_path / "e",
                 "--max-batch-size", "4")
    assert result.exit_code == 1
    assert result.stdout.startswith("trtllm-build --checkpoint_dir ") and "tokens_per_step" in result.stdout
    assert "tensorrt_llm is not importable here" in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("args,message", [
    (["--lookahead", "7,7,7"], "--lookahead applies to --backend trtllm only"),
    (["--backend", "trtllm", "--lookahead", "7;7;7"], "expects W,N,G"),
    (["--backend", "trtllm", "--eagle2", "4,8,63"], "exposes no dynamic tree"),
])
def test_cli_flag_errors(checkpoints, tmp_path, args, message):
    result = run("build", checkpoints["llama-3.1-8b"], "--out", tmp_path / "e", *args)
    assert result.exit_code != 0 and message in result.output
