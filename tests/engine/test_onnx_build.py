"""`trtspec build --backend onnx`: plan validation, the manifest, and the built engine's files."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.manifest import ONNX_GRAPH_FORMAT, Manifest, read_manifest
from trtspec.engine.onnx_builder import BuildOptions, build, plan_build
from trtspec.errors import BuildError, ConfigError
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64)


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    out = tiny_trtllm_checkpoints(tmp_path_factory.mktemp("ckpts"), MODEL)
    return {"plain": out["none"], "medusa": out["medusa"], "eagle": out["eagle"]}


@pytest.mark.parametrize("name,kwargs,method,k", [
    ("plain", {}, "none", 0),
    ("medusa", {}, "medusa", 8),  # default tree: medusa_small_8
    ("medusa", {"choices": "[[0],[1],[0,0]]", "max_draft_len": 5}, "medusa", 5),
    ("medusa", {"no_spec": True}, "none", 0),
    ("eagle", {"preset": "chain_3"}, "eagle", 3),
])
def test_plan(ckpts, tmp_path, name, kwargs, method, k):
    m = plan_build(BuildOptions(source=ckpts[name], out=tmp_path / "e", max_input_len=64, **kwargs))
    assert (m.method.value, m.profile.max_draft_len, m.profile.tokens_per_step) == (method, k, k + 1)
    assert Manifest.from_dict(m.to_dict()) == m


@pytest.mark.parametrize("name,kwargs,error,message", [
    ("medusa", {"choices": "[[0],[1],[0,0]]", "max_draft_len": 2}, ConfigError,
     "3 tree nodes need --max-draft-len >= 3 (got 2)"),
    ("medusa", {"choices": "[[0],[0,0],[0,0,0],[0,0,0,0]]"}, ConfigError, "tree depth 4 exceeds the 3 Medusa heads"),
    ("medusa", {"max_input_len": 100, "max_seq_len": 100}, ConfigError,
     "max_seq_len=100 is below max_input_len=100 + max_draft_len=8 + 1"),
    ("plain", {"preset": "chain_2"}, BuildError, "has no drafter"),
    ("medusa", {"max_input_len": 400, "max_seq_len": 1000}, BuildError, "exceeds the model's max_position_embeddings=512"),
    ("medusa", {"choices": "[[0]]", "preset": "chain_2"}, ConfigError, "either --choices or --preset"),
])
def test_plan_errors_name_both_sides(ckpts, tmp_path, name, kwargs, error, message):
    with pytest.raises(error, match=re.escape(message)):
        plan_build(BuildOptions(source=ckpts[name], out=tmp_path / "e", **{"max_input_len": 64, **kwargs}))


def test_build_writes_graphs_and_manifest_last(ckpts, tmp_path):
    out = tmp_path / "engine"
    manifest = build(BuildOptions(source=ckpts["eagle"], out=out, preset="chain_3", max_input_len=64))
    assert read_manifest(out) == manifest
    assert set(manifest.files) >= {"context", "generation", "draft_context", "draft_generation"}
    assert max(manifest.numerics.values()) < 1e-4
    assert [p.name for p in tmp_path.iterdir()] == ["engine"]  # no temp dirs left


def test_build_cli_dry_run_and_errors(ckpts, tmp_path):
    runner = CliRunner()
    res = runner.invoke(cli, ["build", str(ckpts["medusa"]), "--out", str(tmp_path / "e"), "--dry-run",
                              "--max-input-len", "64"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["profile"]["max_draft_len"] == 8
    assert not (tmp_path / "e").exists()
    res = runner.invoke(cli, ["build", str(ckpts["medusa"]), "--out", str(tmp_path / "e"), "--max-input-len", "64",
                              "--choices", "[[0],[1]]", "--max-draft-len", "1"])
    assert res.exit_code == 1 and res.output.startswith("error: 2 tree nodes need --max-draft-len >= 2 (got 1)")
    assert not (tmp_path / "e").exists()


def test_building_a_hugging_face_folder_says_to_convert_first(tmp_path):
    from trtspec.testing import write_hf_base

    base = write_hf_base(tmp_path / "hf", MODEL)
    with pytest.raises(BuildError, match="looks like a Hugging Face folder: run `trtspec convert --base"):
        plan_build(BuildOptions(source=base, out=tmp_path / "e"))


def test_manifest_rejects_unknown_keys_and_versions(ckpts, tmp_path):
    m = plan_build(BuildOptions(source=ckpts["medusa"], out=tmp_path / "e", max_input_len=64)).to_dict()
    with pytest.raises(ConfigError, match="unknown key 'colour'; valid keys"):
        Manifest.from_dict({**m, "colour": "red"})
    with pytest.raises(BuildError, match="manifest version 99"):
        Manifest.from_dict({**m, "version": 99})
    with pytest.raises(ConfigError, match="missing key 'graph_format'"):
        Manifest.from_dict({k: v for k, v in m.items() if k != "graph_format"})



@pytest.mark.parametrize("graph_format", [ONNX_GRAPH_FORMAT - 1, None])
def test_manifest_of_another_graph_format_says_to_rebuild(ckpts, tmp_path, graph_format):
    """The runtime runs one graph contract (inputs, outputs, KV layout): graphs of another cannot run."""
    m = plan_build(BuildOptions(source=ckpts["medusa"], out=tmp_path / "e", max_input_len=64)).to_dict()
    assert m["graph_format"] == ONNX_GRAPH_FORMAT
    with pytest.raises(BuildError, match=rf"graphs are of format {graph_format}, this trtspec runs format "
                                         rf"{ONNX_GRAPH_FORMAT}; rebuild the engine with this trtspec"):
        Manifest.from_dict({**m, "graph_format": graph_format})


def test_plan_rejects_a_head_dim_the_attention_kernel_cannot_run(tmp_path):
    ckpt = tiny_trtllm_checkpoints(tmp_path, TinyModel(hidden_size=96, num_heads=12, num_kv_heads=4), ("none",))
    with pytest.raises(BuildError, match="the model's head_dim is 8; .* needs a multiple of 16"):
        plan_build(BuildOptions(source=ckpt["none"], out=tmp_path / "e", max_input_len=64))
