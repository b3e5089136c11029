"""The manifest's `model` section is the checkpoint's ModelShape (plus the ids the build read beside it), and
manifests written before it carried the whole shape still read and run."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest

from trtspec.checkpoint.model_shape import ModelShape
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.engine.manifest import LEGACY_MODEL_KEYS, Manifest, ModelInfo, read_manifest
from trtspec.errors import ConfigError
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing.checkpoints import tiny_engine

SHAPE_FIELDS = [f.name for f in dataclasses.fields(ModelShape)]
UNRECORDED = ("intermediate_size", "rms_norm_eps", "rope_theta", "max_position_embeddings", "hidden_act", "qkv_bias",
              "o_bias", "mlp_bias", "tie_word_embeddings")


@pytest.fixture(scope="module", params=["none", "medusa", "eagle"])
def engine(request, tmp_path_factory):
    return tiny_engine(tmp_path_factory.mktemp(request.param), drafter=request.param, max_input_len=16,
                       max_seq_len=64)


def _legacy_model(model: ModelInfo) -> dict:
    """The `model` section as trtspec wrote it before the manifest carried the whole shape (engine.manifest.ModelInfo
    of that version: the target's dimensions, the drafter's counts and the EAGLE draft's KV dimensions)."""
    return {"architecture": model.architecture, "dtype": model.dtype, "vocab_size": model.vocab_size,
            "hidden_size": model.hidden_size, "num_layers": model.num_layers, "num_heads": model.num_heads,
            "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim, "num_medusa_heads": model.num_medusa_heads,
            "num_eagle_layers": model.num_eagle_layers, "draft_layers": model.draft_layers,
            "draft_num_kv_heads": model.draft_num_kv_heads, "draft_head_dim": model.draft_head_dim,
            "end_id": model.end_id, "pad_id": model.pad_id, "max_non_leaves_per_layer": model.max_non_leaves_per_layer,
            "logits_dtype": model.logits_dtype, "draft_vocab_size": model.draft_vocab_size}


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


def test_a_manifest_of_an_earlier_version_reads_and_runs_alike(engine, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(engine, old)
    data = json.loads((old / "manifest.json").read_text())
    data["model"] = _legacy_model(read_manifest(engine).model)
    assert set(data["model"]) == LEGACY_MODEL_KEYS
    (old / "manifest.json").write_text(json.dumps(data))

    new, legacy = read_manifest(engine).model, read_manifest(old).model
    kept = ("architecture", "dtype", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
            "head_dim", "num_medusa_heads", "num_eagle_layers", "draft_layers", "draft_num_kv_heads", "draft_head_dim",
            "end_id", "pad_id", "max_non_leaves_per_layer", "logits_dtype", "draft_vocab_size")
    assert {k: getattr(legacy, k) for k in kept} == {k: getattr(new, k) for k in kept}
    assert all(getattr(legacy, k) is None for k in UNRECORDED)  # not recorded, not guessed
    assert Manifest.from_dict(read_manifest(old).to_dict()) == read_manifest(old)

    config = GenerationConfig(max_tokens=12)
    outputs = [LocalGenerator(e, threads=1).generate([5, 6, 7, 8], config).output_ids for e in (engine, old)]
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0


def test_a_model_section_with_an_unknown_key_names_it():
    data = {f: 1 for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim")}
    with pytest.raises(ConfigError, match="manifest.json: model: unknown key 'colour'"):
        ModelInfo.from_dict({**data, "architecture": "LlamaForCausalLM", "colour": "red"}, "manifest.json: model")


def test_an_earlier_model_section_with_an_unknown_key_names_it():
    legacy = {"architecture": "LlamaForCausalLM", "dtype": "float32", "vocab_size": 320, "hidden_size": 64,
              "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16, "draft_layers": 0}
    assert ModelInfo.from_dict(legacy, "m").intermediate_size is None
    with pytest.raises(ConfigError, match="m: unknown key 'zz_extra'"):
        ModelInfo.from_dict({**legacy, "zz_extra": 1}, "m")
