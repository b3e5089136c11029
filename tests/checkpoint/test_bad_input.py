"""`trtspec convert` on bad input: one `error:` line naming file / tensor / field and value, exit 1, nothing written.

Each case builds its inputs with the tiny checkpoint factory (plus a small edit), runs the CLI, and checks the
contract: exit code 1, exactly one line on stderr, no traceback, and no `out` or `.out.tmp-*` left behind.
"""

from __future__ import annotations

import datetime
import json
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from trtspec.cli import cli
from trtspec.testing import (TinyModel, write_eagle3_draft, write_eagle_draft, write_hf_base, write_medusa_heads,
                             write_redrafter_drafter)

GQA = TinyModel()  # hidden 64, 4 heads, 2 KV heads, 2 layers, vocab 256


# ---- building blocks ------------------------------------------------------------------------------------

def convert_args(tmp: Path, *extra: str) -> list[str]:
    """Return `convert --base tmp/base --out tmp/out` plus extra flags."""
    return ["convert", "--base", str(tmp / "base"), "--out", str(tmp / "out"), *extra]


def edit_config(directory: Path, **changes) -> None:
    """Rewrite fields of directory/config.json; a value of None deletes the field."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config, indent=2))


def edit_safetensors(path: Path, *, drop: tuple[str, ...] = (), put: dict[str, torch.Tensor] | None = None) -> None:
    """Rewrite a safetensors file without the keys in drop and with the tensors in put added or replaced."""
    state = {k: v for k, v in load_file(str(path)).items() if k not in drop}
    save_file(state | (put or {}), str(path), metadata={"format": "pt"})


def read_rank(out: Path, rank: int = 0) -> dict[str, torch.Tensor]:
    """Load every tensor of out/rank{rank}.safetensors."""
    with safe_open(str(out / f"rank{rank}.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def run_cli(args: list[str]):
    """Invoke the CLI in-process, keeping stdout and stderr apart."""
    return CliRunner().invoke(cli, args)


def leftovers(tmp: Path) -> list[str]:
    """Names of temporary siblings the converter may leave beside tmp/out."""
    return sorted(p.name for p in tmp.iterdir() if p.name.startswith(".out."))


# ---- bad-input builders: each writes its inputs under tmp and returns the CLI arguments -------------------

def medusa_other_hidden(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", TinyModel(hidden_size=32))
    return convert_args(tmp, "--medusa", str(tmp / "medusa"))


def medusa_other_vocab(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", TinyModel(vocab_size=128))
    return convert_args(tmp, "--medusa", str(tmp / "medusa"))


def medusa_too_many_heads(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", GQA, num_heads=4)
    return convert_args(tmp, "--medusa", str(tmp / "medusa"), "--num-medusa-heads", "5")


def medusa_wrong_layers(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", GQA, num_layers=1)
    return convert_args(tmp, "--medusa", str(tmp / "medusa"), "--num-medusa-layers", "2")


def medusa_no_heads(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    (tmp / "medusa").mkdir()
    return convert_args(tmp, "--medusa", str(tmp / "medusa"))


def eagle_other_hidden(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", TinyModel(hidden_size=32))
    return convert_args(tmp, "--eagle", str(tmp / "eagle"))


def eagle_no_fc_bias(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA, fc_bias=False, config_bias=None)
    return convert_args(tmp, "--eagle", str(tmp / "eagle"))


def eagle3_as_eagle(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle3_draft(tmp / "eagle3", GQA)
    return convert_args(tmp, "--eagle", str(tmp / "eagle3"))


def eagle_d2t_without_t2d(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA, storage="safetensors", draft_vocab_size=32)
    edit_safetensors(tmp / "eagle" / "model.safetensors", drop=("t2d",))
    return convert_args(tmp, "--eagle", str(tmp / "eagle"))


def eagle_d2t_out_of_range(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA, storage="safetensors", draft_vocab_size=32)
    d2t = torch.zeros(32, dtype=torch.int64)
    d2t[-1] = 1000  # the last draft id would map to target id 1031 of 256
    edit_safetensors(tmp / "eagle" / "model.safetensors", put={"d2t": d2t})
    return convert_args(tmp, "--eagle", str(tmp / "eagle"))


def eagle_long_draft(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA)
    return convert_args(tmp, "--eagle", str(tmp / "eagle"), "--max-draft-len", "300")


def eagle_pipeline(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA)
    return convert_args(tmp, "--eagle", str(tmp / "eagle"), "--pp-size", "2")


def medusa_and_eagle(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", GQA)
    write_eagle_draft(tmp / "eagle", GQA)
    return convert_args(tmp, "--medusa", str(tmp / "medusa"), "--eagle", str(tmp / "eagle"))


def redrafter_other_model(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_redrafter_drafter(tmp / "redrafter", TinyModel(hidden_size=32, num_heads=2, num_kv_heads=1, vocab_size=128))
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"))


def redrafter_layers_disagree(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    edit_config(write_redrafter_drafter(tmp / "redrafter", GQA, num_draft_layers=2), num_draft_layers=1)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"))


def redrafter_no_input_proj(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    d = write_redrafter_drafter(tmp / "redrafter", GQA, exit_dim=96)
    edit_safetensors(d / "model.safetensors", drop=("input_proj.weight", "input_proj.bias"))
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"))


def redrafter_no_weights(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    (write_redrafter_drafter(tmp / "redrafter", GQA) / "model.safetensors").unlink()
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"))


def redrafter_rnn_missing(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    edit_config(write_redrafter_drafter(tmp / "redrafter", GQA), rnn=None)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"))


def redrafter_tp_vs_exit_dim(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)  # hidden 64, 4 heads: --tp-size 4 divides the base
    write_redrafter_drafter(tmp / "redrafter", GQA, exit_dim=98)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"), "--tp-size", "4")


def redrafter_pipeline(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_redrafter_drafter(tmp / "redrafter", GQA)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"), "--pp-size", "2")


def redrafter_qwen2_old_version(tmp: Path) -> list[str]:
    qwen = TinyModel(arch="qwen2")
    write_hf_base(tmp / "base", qwen)
    write_redrafter_drafter(tmp / "redrafter", qwen)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"), "--trtllm-version", "0.21")


def redrafter_version_out_of_range(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_redrafter_drafter(tmp / "redrafter", GQA)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"), "--trtllm-version", "0.14")


def trtllm_version_without_redrafter(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", GQA)
    return convert_args(tmp, "--medusa", str(tmp / "medusa"), "--trtllm-version", "1.0")


def redrafter_and_eagle(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_eagle_draft(tmp / "eagle", GQA)
    write_redrafter_drafter(tmp / "redrafter", GQA)
    return convert_args(tmp, "--eagle", str(tmp / "eagle"), "--redrafter", str(tmp / "redrafter"))


def redrafter_zero_beams(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_redrafter_drafter(tmp / "redrafter", GQA)
    return convert_args(tmp, "--redrafter", str(tmp / "redrafter"), "--redrafter-num-beams", "0")


def zero_draft_len(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    write_medusa_heads(tmp / "medusa", GQA)
    return convert_args(tmp, "--medusa", str(tmp / "medusa"), "--max-draft-len", "0")


def tp_vs_heads(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)  # 4 attention heads
    return convert_args(tmp, "--tp-size", "3")


def tp_not_multiple_of_kv(tmp: Path) -> list[str]:
    # 12 heads, hidden 96, intermediate 192 all divide by 6; 4 KV heads cannot be duplicated onto 6 ranks.
    write_hf_base(tmp / "base", TinyModel(hidden_size=96, num_heads=12, num_kv_heads=4, intermediate_size=192))
    return convert_args(tmp, "--tp-size", "6")


def tp_not_dividing_kv(tmp: Path) -> list[str]:
    # 12 heads, hidden 96, intermediate 128 all divide by 4; 6 KV heads do not split over 4 ranks.
    write_hf_base(tmp / "base", TinyModel(hidden_size=96, num_heads=12, num_kv_heads=6, intermediate_size=128))
    return convert_args(tmp, "--tp-size", "4")


def pp_vs_layers(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)  # 2 layers
    return convert_args(tmp, "--pp-size", "3")


def zero_tp(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    return convert_args(tmp, "--tp-size", "0")


def truncated_safetensors(tmp: Path) -> list[str]:
    path = write_hf_base(tmp / "base", GQA) / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return convert_args(tmp)


def garbage_bin(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA, storage="bin")
    (base / "pytorch_model.bin").write_bytes(b"this is not a torch checkpoint\n" * 8)
    return convert_args(tmp)


def truncated_bin(tmp: Path) -> list[str]:
    path = write_hf_base(tmp / "base", GQA, storage="bin") / "pytorch_model.bin"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return convert_args(tmp)


def bin_with_non_tensor_object(tmp: Path) -> list[str]:
    # Training scripts save extra state next to the weights; weights_only loading refuses the pickle global.
    base = write_hf_base(tmp / "base", GQA, storage="bin")
    torch.save({"model.embed_tokens.weight": torch.zeros(2), "saved_on": datetime.date(2024, 1, 1)},
               base / "pytorch_model.bin")
    return convert_args(tmp)


def safetensors_entry_without_offsets(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA)
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "F32", "shape": [256, 64]}}).encode()
    (base / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return convert_args(tmp)


def index_weight_map_not_object(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA, storage="sharded")
    (base / "model.safetensors.index.json").write_text('{"metadata": {}, "weight_map": ["model-00001.safetensors"]}')
    return convert_args(tmp)


def missing_shard(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA, storage="sharded")
    index_path = base / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    last = sorted(set(index["weight_map"].values()))[-1]
    (base / last).unlink()  # the index now points at a file that is gone, named so the test can expect it
    index["weight_map"] = {k: "model-lost.safetensors" if v == last else v for k, v in index["weight_map"].items()}
    index_path.write_text(json.dumps(index))
    return convert_args(tmp)


def unknown_architecture(tmp: Path) -> list[str]:
    edit_config(write_hf_base(tmp / "base", GQA), architectures=["GPT2LMHeadModel"], model_type="gpt2")
    return convert_args(tmp)


def config_without_hidden_size(tmp: Path) -> list[str]:
    edit_config(write_hf_base(tmp / "base", GQA), hidden_size=None)
    return convert_args(tmp)


def config_not_json(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA)
    (base / "config.json").write_text('{"hidden_size": 64,')
    return convert_args(tmp)


def config_kv_heads_not_int(tmp: Path) -> list[str]:
    edit_config(write_hf_base(tmp / "base", GQA), num_key_value_heads="2")
    return convert_args(tmp)


def base_missing_tensor(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA)
    edit_safetensors(base / "model.safetensors", drop=("model.layers.1.mlp.up_proj.weight",))
    return convert_args(tmp)


def base_extra_tensor(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA)
    edit_safetensors(base / "model.safetensors", put={"model.layers.0.mlp.extra_proj.weight": torch.zeros(8, 64)})
    return convert_args(tmp)


def base_wrong_shape(tmp: Path) -> list[str]:
    base = write_hf_base(tmp / "base", GQA)  # k_proj is [2 KV heads * 16, 64] = [32, 64]
    edit_safetensors(base / "model.safetensors", put={"model.layers.0.self_attn.k_proj.weight": torch.zeros(48, 64)})
    return convert_args(tmp)


def out_not_empty(tmp: Path) -> list[str]:
    write_hf_base(tmp / "base", GQA)
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("precious\n")
    return convert_args(tmp)


BAD_INPUT: list = [
    pytest.param(medusa_other_hidden, ("medusa/medusa_lm_head.pt", "0.0.linear.weight", "[32, 32]",
                                       "expected [64, 64]", "hidden_size=64"), id="medusa-hidden-size"),
    pytest.param(medusa_other_vocab, ("medusa/medusa_lm_head.pt", "0.1.weight", "[128, 64]",
                                      "vocab_size=256"), id="medusa-vocab-size"),
    pytest.param(medusa_too_many_heads, ("medusa/medusa_lm_head.pt", "stores 4 Medusa heads",
                                         "--num-medusa-heads 5", "pass --num-medusa-heads 4"),
                 id="medusa-more-heads-than-stored"),
    pytest.param(medusa_wrong_layers, ("medusa/medusa_lm_head.pt", "stores 1 ResBlock layer",
                                       "--num-medusa-layers 2", "pass --num-medusa-layers 1"),
                 id="medusa-layers-disagree"),
    pytest.param(medusa_no_heads, ("/medusa", "no Medusa heads found", "medusa_lm_head.pt"), id="medusa-no-heads"),
    pytest.param(eagle_other_hidden, ("eagle/config.json", "hidden_size=32", "hidden_size=64"),
                 id="eagle-hidden-size"),
    pytest.param(eagle_no_fc_bias, ("eagle/pytorch_model.bin", "fc.bias", "eagle/config.json", '"bias": false'),
                 id="eagle-fc-bias-missing"),
    pytest.param(eagle3_as_eagle, ("eagle3", "EAGLE-3", "EAGLE-1/2", "trtspec inspect"), id="eagle3-given-to-eagle"),
    pytest.param(eagle_d2t_without_t2d, ("eagle/model.safetensors", "needs both d2t and t2d"),
                 id="eagle-d2t-without-t2d"),
    pytest.param(eagle_d2t_out_of_range, ("eagle/model.safetensors", "d2t maps draft ids outside"),
                 id="eagle-d2t-out-of-range"),
    pytest.param(eagle_long_draft, ("--max-draft-len 300", "256", "EAGLE"), id="eagle-max-draft-len-300"),
    pytest.param(eagle_pipeline, ("--pp-size 2", "EagleForCausalLM", "pp_size 1"), id="eagle-pp-size-2"),
    pytest.param(medusa_and_eagle, ("--medusa", "--eagle", "exclusive"), id="medusa-and-eagle"),
    pytest.param(redrafter_other_model, ("redrafter/config.json", "hidden_size=32", "hidden_size=64",
                                         "redrafter/model.safetensors", "lm_head.2.weight", "vocab_size=256"),
                 id="redrafter-other-model"),
    pytest.param(redrafter_layers_disagree, ("redrafter/config.json", "num_draft_layers=1", "lm_head.2.weight"),
                 id="redrafter-num-draft-layers"),
    pytest.param(redrafter_no_input_proj, ("redrafter/config.json", "exit_dim=96", "input_proj.weight"),
                 id="redrafter-no-input-proj"),
    pytest.param(redrafter_no_weights, ("/redrafter", "model.safetensors or model.pt"), id="redrafter-no-weights"),
    pytest.param(redrafter_rnn_missing, ("redrafter/config.json", "field rnn", "None"), id="redrafter-rnn-missing"),
    pytest.param(redrafter_tp_vs_exit_dim, ("--tp-size 4", "exit_dim=98", "redrafter/config.json"),
                 id="redrafter-tp-vs-exit-dim"),
    pytest.param(redrafter_pipeline, ("--pp-size 2", "ReDrafter", "pp_size 1"), id="redrafter-pp-size-2"),
    pytest.param(redrafter_qwen2_old_version, ("base/config.json", "0.21", "ReDrafterForCausalLM",
                                               "Qwen2ForCausalLM", "--trtllm-version 1.0"),
                 id="redrafter-qwen2-before-1.0"),
    pytest.param(redrafter_version_out_of_range, ("--trtllm-version 0.14", "0.15"), id="redrafter-version-0.14"),
    pytest.param(trtllm_version_without_redrafter, ("--trtllm-version 1.0", "--redrafter only"),
                 id="trtllm-version-without-redrafter"),
    pytest.param(redrafter_and_eagle, ("--eagle", "--redrafter", "exclusive"), id="redrafter-and-eagle"),
    pytest.param(redrafter_zero_beams, ("--redrafter-num-beams", ">= 1", "got 0"), id="redrafter-num-beams-0"),
    pytest.param(zero_draft_len, ("--max-draft-len", ">= 1", "got 0"), id="max-draft-len-0"),
    pytest.param(tp_vs_heads, ("--tp-size 3", "num_attention_heads=4", "base/config.json"), id="tp-vs-heads"),
    pytest.param(tp_not_multiple_of_kv, ("--tp-size 6", "not a multiple of num_key_value_heads=4",
                                         "base/config.json"), id="tp-not-multiple-of-kv-heads"),
    pytest.param(tp_not_dividing_kv, ("--tp-size 4", "does not divide num_key_value_heads=6", "base/config.json"),
                 id="tp-not-dividing-kv-heads"),
    pytest.param(pp_vs_layers, ("--pp-size 3", "num_hidden_layers=2", "base/config.json"), id="pp-vs-layers"),
    pytest.param(zero_tp, ("tp_size", "0", ">= 1"), id="tp-size-0"),
    pytest.param(truncated_safetensors, ("base/model.safetensors", "truncated"), id="truncated-safetensors"),
    pytest.param(garbage_bin, ("base/pytorch_model.bin", "cannot read torch checkpoint"), id="garbage-bin"),
    pytest.param(truncated_bin, ("base/pytorch_model.bin", "cannot read torch checkpoint"), id="truncated-bin"),
    pytest.param(bin_with_non_tensor_object, ("base/pytorch_model.bin", "cannot read torch checkpoint",
                                              "datetime.date"), id="bin-with-non-tensor-object"),
    pytest.param(safetensors_entry_without_offsets, ("base/model.safetensors", "model.embed_tokens.weight",
                                                     "data_offsets"), id="safetensors-entry-without-offsets"),
    pytest.param(index_weight_map_not_object, ("base/model.safetensors.index.json", "weight_map"),
                 id="index-weight-map-not-object"),
    pytest.param(missing_shard, ("base/model-lost.safetensors", "not found"), id="missing-shard"),
    pytest.param(unknown_architecture, ("base/config.json", "GPT2LMHeadModel", "LlamaForCausalLM"),
                 id="unknown-architecture"),
    pytest.param(config_without_hidden_size, ("base/config.json", "hidden_size", "None"), id="config-no-hidden-size"),
    pytest.param(config_not_json, ("base/config.json", "not valid JSON"), id="config-not-json"),
    pytest.param(config_kv_heads_not_int, ("base/config.json", "num_key_value_heads", "'2'"),
                 id="config-kv-heads-not-int"),
    pytest.param(base_missing_tensor, ("base", "model.layers.1.mlp.up_proj.weight", "not found"),
                 id="base-missing-tensor"),
    pytest.param(base_extra_tensor, ("base/model.safetensors", "model.layers.0.mlp.extra_proj.weight",
                                     "no place"), id="base-extra-tensor"),
    pytest.param(base_wrong_shape, ("base/model.safetensors", "model.layers.0.self_attn.k_proj.weight",
                                    "[48, 64]", "expected [32, 64]", "num_key_value_heads=2"),
                 id="base-wrong-shape"),
    pytest.param(out_not_empty, ("/out", "not empty", "--force"), id="out-not-empty"),
]


@pytest.mark.parametrize(("build", "expected"), BAD_INPUT)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         build: Callable[[Path], list[str]],
                                                         expected: tuple[str, ...]) -> None:
    monkeypatch.delenv("TRTSPEC_DEBUG", raising=False)
    args = build(tmp_path)
    out = tmp_path / "out"
    before = (out.is_dir(), sorted(p.name for p in out.iterdir()) if out.is_dir() else None, out.is_file())
    result = run_cli(args)
    assert isinstance(result.exception, SystemExit), f"uncaught {result.exception!r}\n{result.output}"
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in expected:
        assert part in lines[0], f"{part!r} not in {lines[0]!r}"
    after = (out.is_dir(), sorted(p.name for p in out.iterdir()) if out.is_dir() else None, out.is_file())
    assert after == before, "the output path changed"
    assert leftovers(tmp_path) == []


# ---- the success twins of three error cases ----------------------------------------------------------------

def test_fc_bias_missing_with_bias_false_converts_to_zero_bias(tmp_path: Path) -> None:
    write_hf_base(tmp_path / "base", GQA)
    write_eagle_draft(tmp_path / "eagle", GQA, fc_bias=False, config_bias=False)
    result = run_cli(convert_args(tmp_path, "--eagle", str(tmp_path / "eagle"), "--json"))
    assert result.exit_code == 0, result.output
    bias = read_rank(tmp_path / "out")["eagle_nets.0.drafter.fc.bias"]
    assert bias.shape == (GQA.hidden_size,)
    assert torch.equal(bias, torch.zeros_like(bias))


def test_eagle_without_embed_tokens_takes_the_base_embedding(tmp_path: Path) -> None:
    base = write_hf_base(tmp_path / "base", GQA)
    write_eagle_draft(tmp_path / "eagle", GQA, embed_tokens=False)
    result = run_cli(convert_args(tmp_path, "--eagle", str(tmp_path / "eagle"), "--json"))
    assert result.exit_code == 0, result.output
    embedding = read_rank(tmp_path / "out")["eagle_nets.0.drafter.vocab_embedding.weight"]
    assert torch.equal(embedding, load_file(str(base / "model.safetensors"))["model.embed_tokens.weight"])


def test_force_replaces_a_non_empty_out(tmp_path: Path) -> None:
    write_hf_base(tmp_path / "base", GQA)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "old.txt").write_text("old run\n")
    result = run_cli(convert_args(tmp_path, "--force", "--json"))
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "rank0.safetensors",
                                                                   "trtspec-convert.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "out"]  # no .out.tmp-* / .out.old-* left
