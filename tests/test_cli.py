"""The `trtspec` command line through CliRunner: help text, convert output, inspect on every kind of folder."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.testing import TinyModel, write_eagle3_draft, write_eagle_draft, write_hf_base, write_medusa_heads

GQA = TinyModel()  # llama, hidden 64, 4 heads, 2 KV heads, 2 layers, intermediate 128, vocab 256, untied
QWEN = TinyModel(arch="qwen2", num_kv_heads=4)
CONVERT_FLAGS = ("--base", "--out", "--medusa", "--num-medusa-heads", "--num-medusa-layers", "--eagle",
                 "--num-eagle-layers", "--max-non-leaves-per-layer", "--max-draft-len", "--dtype", "--tp-size",
                 "--pp-size", "--force")


def run_cli(*args: str):
    """Invoke the CLI in-process, keeping stdout and stderr apart."""
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---- parameter counts spelled out from the model dimensions (the oracle) --------------------------------

def attn_params(m: TinyModel, in_dim: int, qkv_bias: bool) -> int:
    """q, k, v read in_dim features; o writes hidden_size."""
    q, kv = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim
    return (q + 2 * kv) * in_dim + m.hidden_size * q + ((q + 2 * kv) if qkv_bias else 0)


def layer_params(m: TinyModel, *, input_norm: bool = True) -> int:
    """One decoder layer: attention, SwiGLU MLP and its RMSNorms."""
    norms = (2 if input_norm else 1) * m.hidden_size
    return attn_params(m, m.hidden_size, m.arch == "qwen2") + 3 * m.intermediate_size * m.hidden_size + norms


def base_params(m: TinyModel) -> int:
    """Embedding, layers, final norm and (untied) lm_head."""
    vh = m.vocab_size * m.hidden_size
    return vh + m.num_layers * layer_params(m) + m.hidden_size + (0 if m.tie_word_embeddings else vh)


def medusa_params(m: TinyModel, heads: int, layers: int) -> int:
    """Each head: `layers` ResBlocks (H×H + bias) and its own lm_head."""
    h = m.hidden_size
    return heads * (layers * (h * h + h) + m.vocab_size * h)


def eagle_params(m: TinyModel) -> int:
    """Embedding, fc over cat(embed, feature) with bias, one layer without input norm."""
    h = m.hidden_size
    return m.vocab_size * h + 2 * h * h + h + layer_params(m, input_norm=False)


def eagle3_params(m: TinyModel, draft_vocab: int) -> int:
    """Midlayer reading cat(emb, hidden), three norms, fc over three features, norm, draft lm_head, d2t, t2d."""
    h = m.hidden_size
    midlayer = attn_params(m, 2 * h, False) + 3 * m.intermediate_size * h + 3 * h
    return midlayer + 3 * h * h + h + draft_vocab * h + draft_vocab + m.vocab_size


# ---- help ------------------------------------------------------------------------------------------------

def test_group_help_lists_the_commands() -> None:
    result = run_cli("--help")
    assert result.exit_code == 0, result.output
    commands = result.stdout.split("Commands:")[1].split()
    assert "convert" in commands and "inspect" in commands


def test_convert_help_shows_every_flag() -> None:
    result = run_cli("convert", "--help")
    assert result.exit_code == 0, result.output
    missing = [flag for flag in CONVERT_FLAGS if f"{flag} " not in result.stdout]
    assert missing == []


# ---- convert ---------------------------------------------------------------------------------------------

def test_convert_prints_one_wrote_line(tmp_path: Path) -> None:
    base = write_hf_base(tmp_path / "base", GQA)
    result = run_cli("convert", "--base", base, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"wrote {tmp_path / 'out'}: LlamaForCausalLM"), result.stdout


@pytest.mark.parametrize(("flags", "architecture", "world_size"), [
    pytest.param((), "LlamaForCausalLM", 1, id="base"),
    pytest.param(("--tp-size", "2", "--pp-size", "2"), "LlamaForCausalLM", 4, id="base-tp2-pp2"),
    pytest.param(("--medusa", "{medusa}", "--tp-size", "2"), "MedusaForCausalLM", 2, id="medusa-tp2"),
    pytest.param(("--eagle", "{eagle}"), "EagleForCausalLM", 1, id="eagle"),
])
def test_convert_json(tmp_path: Path, flags: tuple[str, ...], architecture: str, world_size: int) -> None:
    base = write_hf_base(tmp_path / "base", GQA)
    drafts = {"medusa": write_medusa_heads(tmp_path / "medusa", GQA),
              "eagle": write_eagle_draft(tmp_path / "eagle", GQA)}
    result = run_cli("convert", "--base", base, "--out", tmp_path / "out", "--json",
                     *(f.format(**drafts) for f in flags))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert (summary["architecture"], summary["world_size"]) == (architecture, world_size)
    assert summary["out"] == str(tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").glob("rank*.safetensors")) == [
        f"rank{r}.safetensors" for r in range(world_size)]


# ---- inspect ---------------------------------------------------------------------------------------------

def converted_tp2(tmp: Path) -> Path:
    """A TensorRT-LLM checkpoint of the GQA base at tp_size 2 (vocab 256 splits evenly, lm_head untied)."""
    base = write_hf_base(tmp / "base", GQA)
    result = run_cli("convert", "--base", base, "--out", tmp / "trtllm", "--tp-size", "2", "--json")
    assert result.exit_code == 0, result.output
    return tmp / "trtllm"


INSPECT: list = [
    pytest.param(lambda t: write_hf_base(t / "d", GQA),
                 {"format": "hf", "architecture": "LlamaForCausalLM", "num_parameters": base_params(GQA),
                  "details": {"shards": 1, "num_kv_heads": 2, "vocab_size": 256}}, id="hf"),
    pytest.param(lambda t: write_hf_base(t / "d", GQA, storage="sharded"),
                 {"format": "hf", "architecture": "LlamaForCausalLM", "num_parameters": base_params(GQA)},
                 id="hf-sharded"),
    pytest.param(lambda t: write_hf_base(t / "d", GQA, storage="bin"),
                 {"format": "hf", "architecture": "LlamaForCausalLM", "num_parameters": base_params(GQA),
                  "details": {"shards": 1}}, id="hf-bin"),
    pytest.param(lambda t: write_hf_base(t / "d", QWEN),
                 {"format": "hf", "architecture": "Qwen2ForCausalLM", "num_parameters": base_params(QWEN)},
                 id="hf-qwen2"),
    pytest.param(lambda t: write_medusa_heads(t / "d", GQA, variant="pt"),
                 {"format": "medusa", "architecture": "Medusa heads", "num_parameters": medusa_params(GQA, 4, 1),
                  "details": {"variant": "faster_decoding", "heads": 4, "config_num_heads": 4, "layers_per_head": 1,
                              "per_head_lm_head": True, "hidden_size": 64, "vocab_size": 256}}, id="medusa-pt"),
    pytest.param(lambda t: write_medusa_heads(t / "d", GQA, variant="pt", config="mismatch"),
                 {"format": "medusa", "num_parameters": medusa_params(GQA, 4, 1),
                  "details": {"heads": 4, "config_num_heads": 2}}, id="medusa-pt-config-mismatch"),
    pytest.param(lambda t: write_medusa_heads(t / "d", GQA, variant="safetensors", num_heads=3, num_layers=2),
                 {"format": "medusa", "num_parameters": medusa_params(GQA, 3, 2),
                  "details": {"heads": 3, "layers_per_head": 2}}, id="medusa-safetensors"),
    pytest.param(lambda t: write_medusa_heads(t / "d", GQA, variant="full_model"),
                 {"format": "hf", "architecture": "LlamaForCausalLM",
                  "num_parameters": base_params(GQA) + medusa_params(GQA, 4, 1),
                  "details": {"medusa": {"variant": "full_model", "heads": 4, "layers": 1}}}, id="medusa-full-model"),
    pytest.param(lambda t: write_medusa_heads(t / "d", GQA, variant="modelopt", num_heads=2),
                 {"format": "hf", "architecture": "LlamaForCausalLM",
                  "num_parameters": base_params(GQA) + medusa_params(GQA, 2, 1),
                  "details": {"medusa": {"variant": "modelopt", "heads": 2, "layers": 1}}}, id="medusa-modelopt"),
    pytest.param(lambda t: write_eagle_draft(t / "d", GQA),
                 {"format": "eagle", "architecture": "EAGLE-1/2 draft", "num_parameters": eagle_params(GQA),
                  "details": {"draft_layers": 1, "hidden_size": 64, "fc_bias": True, "embed_tokens": True}},
                 id="eagle"),
    pytest.param(lambda t: write_eagle3_draft(t / "d", GQA, draft_vocab_size=128),
                 {"format": "eagle3", "architecture": "EAGLE-3 draft", "num_parameters": eagle3_params(GQA, 128),
                  "details": {"vocab_size": 256, "draft_vocab_size": 128, "hidden_size": 64}}, id="eagle3"),
    pytest.param(converted_tp2,
                 {"format": "trtllm", "architecture": "LlamaForCausalLM", "num_parameters": base_params(GQA),
                  "details": {"tp_size": 2, "pp_size": 1, "num_key_value_heads": 2}}, id="trtllm-tp2"),
]


@pytest.mark.parametrize(("build", "expected"), INSPECT)
def test_inspect_json(tmp_path: Path, build: Callable[[Path], Path], expected: dict) -> None:
    directory = build(tmp_path)
    result = run_cli("inspect", directory, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["path"] == str(directory)
    for key, value in expected.items():
        if key == "details":
            assert {k: summary["details"].get(k) for k in value} == value
        else:
            assert summary[key] == value, key


def test_inspect_sharded_counts_its_shards(tmp_path: Path) -> None:
    directory = write_hf_base(tmp_path / "d", GQA, storage="sharded")
    summary = json.loads(run_cli("inspect", directory, "--json").stdout)
    shard_files = sorted(p.name for p in directory.glob("model-*.safetensors"))
    assert summary["details"]["shards"] == len(shard_files) >= 2
    assert sorted(summary["files"]) == shard_files


def test_inspect_text_summary(tmp_path: Path) -> None:
    directory = write_hf_base(tmp_path / "d", GQA)
    result = run_cli("inspect", directory)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"{directory}: hf · LlamaForCausalLM"
    assert lines[1].split() == ["parameters", f"{base_params(GQA):,}"]


def test_inspect_empty_directory_fails_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRTSPEC_DEBUG", raising=False)
    (tmp_path / "empty").mkdir()
    result = run_cli("inspect", tmp_path / "empty")
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(tmp_path / "empty") in lines[0], result.stderr


# ---- the README example flow (scripts/quickstart.sh) ----------------------------------------------------

def test_example_checkpoints_convert_and_inspect(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "trtspec.testing", str(tmp_path / "example")],
                          capture_output=True, text=True, check=True, timeout=120)
    rows = [line.split("\t") for line in proc.stdout.splitlines()]
    assert [name for name, _ in rows] == ["base", "medusa", "eagle"]
    paths = {name: Path(path) for name, path in rows}
    assert paths == {name: tmp_path / "example" / name for name in ("base", "medusa", "eagle")}
    medusa, eagle = tmp_path / "ckpt-medusa", tmp_path / "ckpt-eagle"
    result = run_cli("convert", "--base", paths["base"], "--medusa", paths["medusa"], "--out", medusa,
                     "--tp-size", "2")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {medusa}: MedusaForCausalLM, 2 rank file(s)")
    result = run_cli("convert", "--base", paths["base"], "--eagle", paths["eagle"], "--out", eagle,
                     "--num-eagle-layers", "3")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {eagle}: EagleForCausalLM, 1 rank file(s)")
    medusa_summary = json.loads(run_cli("inspect", medusa, "--json").stdout)
    assert medusa_summary["details"]["num_medusa_heads"] == 4  # the example's config.json says 2; 4 are stored
    assert medusa_summary["details"]["tp_size"] == 2
    eagle_summary = json.loads(run_cli("inspect", eagle, "--json").stdout)
    assert (eagle_summary["architecture"], eagle_summary["details"]["num_eagle_layers"]) == ("EagleForCausalLM", 3)


@pytest.mark.parametrize("flag,value,rule", [
    ("--temperature", "-1", "must be a finite number >= 0 (0 means greedy), got -1.0"),
    ("--top-p", "2", "must be a number in (0, 1] (1 switches top-p off), got 2.0"),
    ("--top-k", "-3", "must be an integer >= 0 (0 switches top-k off), got -3"),
])
def test_sampling_flags_are_named_in_their_error(tmp_path, flag, value, rule):
    """The error names the flag the user typed, not an internal class; checked before any engine is opened."""
    result = CliRunner().invoke(cli, ["generate", str(tmp_path), "--prompt", "hi", flag, value])
    assert result.exit_code == 2
    assert f"Invalid value for '{flag}': {rule}" in result.output
    assert "SamplingParams" not in result.output and "Traceback" not in result.output
