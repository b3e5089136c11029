"""The manifest's `model` section is the checkpoint's ModelShape (plus the ids the build read beside it); a manifest
holds every field, and one of another MANIFEST_VERSION is refused in one line that says to rebuild the engine."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.checkpoint.model_shape import ModelShape
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.cli import cli
from trtspec.engine.manifest import MANIFEST_FILE, MANIFEST_VERSION, Manifest, ModelInfo, read_manifest
from trtspec.errors import BuildError, ConfigError
from trtspec.testing.checkpoints import tiny_engine

SHAPE_FIELDS = [f.name for f in dataclasses.fields(ModelShape)]


@pytest.fixture(scope="module", params=["none", "medusa", "eagle"])
def engine(request, tmp_path_factory):
    return tiny_engine(tmp_path_factory.mktemp(request.param), drafter=request.param, max_input_len=16,
                       max_seq_len=64)


def test_the_manifest_adds_only_the_ids_read_beside_the_checkpoint():
    assert issubclass(ModelInfo, ModelShape)
    names = {f.name for f in dataclasses.fields(ModelInfo)} - set(SHAPE_FIELDS)
    assert names == {"end_id", "pad_id", "draft_vocab_size"}


def test_the_manifest_carries_the_checkpoints_whole_shape(engine):
    manifest = read_manifest(engine)
    shape = ModelShape.from_trtllm(read_trtllm_checkpoint(manifest.source).config)
    assert {k: getattr(manifest.model, k) for k in SHAPE_FIELDS} == {k: getattr(shape, k) for k in SHAPE_FIELDS}
    on_disk = json.loads((engine / "manifest.json").read_text())["model"]
    assert on_disk["intermediate_size"] == shape.intermediate_size and on_disk["rope_theta"] == shape.rope_theta
    assert (on_disk["eagle"] is None) == (shape.eagle is None)


def _rewritten(engine, tmp_path, change) -> Path:
    """A copy of the engine whose manifest.json `change` rewrote."""
    old = tmp_path / "old"
    shutil.copytree(engine, old)
    data = json.loads((old / MANIFEST_FILE).read_text())
    change(data)
    (old / MANIFEST_FILE).write_text(json.dumps(data))
    return old


def _refusal(path, found: str) -> str:
    return (f"{path}: {found}, this trtspec reads version {MANIFEST_VERSION}: the engine was written by an earlier "
            "trtspec; rebuild it with this one (`trtspec build ... --force`)")


OLD_MANIFESTS = {"version 1": (lambda m: m.update(version=1), "manifest version 1"),
                 "version 2": (lambda m: m.update(version=2) or m.pop("redrafter"), "manifest version 2"),
                 "no version": (lambda m: m.pop("version"), "no manifest version")}


@pytest.mark.parametrize("case", OLD_MANIFESTS)
def test_a_manifest_of_another_version_is_refused_in_one_line(engine, tmp_path, case):
    change, found = OLD_MANIFESTS[case]
    old = _rewritten(engine, tmp_path, change)
    with pytest.raises(BuildError) as error:
        read_manifest(old)
    assert str(error.value) == _refusal(old / MANIFEST_FILE, found)
    with pytest.raises(BuildError, match="manifest version 99, .* written by a later trtspec; rebuild it"):
        Manifest.from_dict({**read_manifest(engine).to_dict(), "version": 99})


@pytest.mark.parametrize("command", ["inspect", "generate"])
@pytest.mark.parametrize("case", OLD_MANIFESTS)
def test_the_cli_refuses_a_manifest_of_another_version_in_one_line(engine, tmp_path, case, command):
    change, found = OLD_MANIFESTS[case]
    old = _rewritten(engine, tmp_path, change)
    args = [command, str(old)] + (["--prompt", "hello", "--max-tokens", "4"] if command == "generate" else [])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1, result.output
    assert result.output == f"error: {_refusal(old / MANIFEST_FILE, found)}\n"
    assert "Traceback" not in result.output


def test_a_manifest_missing_a_field_names_it(engine):
    data = read_manifest(engine).to_dict()
    with pytest.raises(ConfigError, match=r"^manifest.json: missing key 'checksums'$"):
        Manifest.from_dict({k: v for k, v in data.items() if k != "checksums"})
    profile = {k: v for k, v in data["profile"].items() if k != "slot_profiles"}
    with pytest.raises(ConfigError, match=r"manifest.json: profile: missing key 'slot_profiles'$"):
        Manifest.from_dict({**data, "profile": profile})
    weights = {**data["weights"], "linear": {k: v for k, v in data["weights"]["linear"].items() if k != "scheme"}}
    with pytest.raises(ConfigError, match=r"manifest.json: weights.linear: missing key 'scheme'$"):
        Manifest.from_dict({**data, "weights": weights})
    model = {k: v for k, v in data["model"].items() if k not in ("intermediate_size", "rope_theta")}
    with pytest.raises(ConfigError, match=r"manifest.json: model: missing keys 'intermediate_size', 'rope_theta'$"):
        Manifest.from_dict({**data, "model": model})


def test_a_model_section_with_an_unknown_key_names_it():
    data = {f: 1 for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")}
    with pytest.raises(ConfigError, match="manifest.json: model: unknown key 'colour'"):
        ModelInfo.from_dict({**data, "architecture": "LlamaForCausalLM", "colour": "red"}, "manifest.json: model")
