"""One model-shape type: the Hugging Face reader and the TensorRT-LLM reader fill the same ModelShape with the same
facts, and the types beside it add only what is not a shape fact."""

from __future__ import annotations

import dataclasses

import pytest

from trtspec import ConvertOptions, convert
from trtspec.checkpoint.hf_config import BaseModelConfig, read_base_config
from trtspec.checkpoint.model_shape import ModelShape
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

SHAPE_FIELDS = [f.name for f in dataclasses.fields(ModelShape)]


def _names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_hf_reader_adds_only_where_it_read_and_the_hf_model_type():
    assert issubclass(BaseModelConfig, ModelShape)
    assert _names(BaseModelConfig) - _names(ModelShape) == {"path", "model_type"}


@pytest.mark.parametrize("model", [TinyModel(), TinyModel(arch="qwen2", tie_word_embeddings=True),
                                   TinyModel(num_kv_heads=4, rope_theta=500000.0, rms_norm_eps=1e-5)],
                         ids=["llama", "qwen2-tied", "llama-mha"])
def test_hf_and_trtllm_config_give_the_same_shape(tmp_path, model):
    base = write_hf_base(tmp_path / "base", model)
    convert(ConvertOptions(base=base, out=tmp_path / "ckpt"), show_progress=False)
    hf = read_base_config(base)
    trt = ModelShape.from_trtllm(read_trtllm_checkpoint(tmp_path / "ckpt").config)
    assert {k: getattr(trt, k) for k in SHAPE_FIELDS} == {k: getattr(hf, k) for k in SHAPE_FIELDS}
    assert trt.tie_word_embeddings is model.tie_word_embeddings and trt.qkv_bias is (model.arch == "qwen2")


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_the_drafters_sizes_are_part_of_the_shape(tmp_path, drafter):
    model = TinyModel()
    base = write_hf_base(tmp_path / "base", model)
    source = (write_medusa_heads(tmp_path / "d", model, num_heads=3) if drafter == "medusa"
              else write_eagle_draft(tmp_path / "d", model))
    convert(ConvertOptions(base=base, out=tmp_path / "ckpt", **{drafter: source}), show_progress=False)
    shape = ModelShape.from_trtllm(read_trtllm_checkpoint(tmp_path / "ckpt").config)
    if drafter == "medusa":
        assert (shape.num_medusa_heads, shape.eagle, shape.draft_layers) == (3, None, 0)
    else:
        assert shape.eagle is not None and shape.eagle.hidden_size == model.hidden_size
        assert (shape.draft_layers, shape.draft_num_kv_heads, shape.draft_head_dim) == (
            shape.eagle.num_layers, model.num_kv_heads, model.head_dim)
    assert ModelShape.from_dict(shape.to_dict(), "model") == shape
