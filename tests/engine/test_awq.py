"""INT4-AWQ TensorRT-LLM checkpoints (quant_algo W4A16_AWQ, ModelOpt's export layout) build CPU engines from their
own codes, scales and pre-quant scales: the dequantized view, the numerics check, lossless speculation, bad input."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from trtspec.checkpoint.awq import LINEAR_SUFFIXES, unpack_codes
from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
from trtspec.cli import cli
from trtspec.engine.manifest import WeightFormat
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.errors import BuildError, CheckpointError
from trtspec.speculative.loop import GenerationConfig, generate
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.methods import make_proposer
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2, vocab_size=96,
                  tie_word_embeddings=True)


def modelopt_pack(codes: np.ndarray) -> np.ndarray:
    """ModelOpt's INT4_AWQ packing, restated from modelopt/torch/export/model_config_utils.py to_quantized_weight:
    codes [out, in] → int8 [out / 2, in], pairs of output rows, the even row in the low nibble."""
    out_dim, in_dim = codes.shape
    t = codes.T.reshape(in_dim, out_dim // 2, 2)
    return np.ascontiguousarray(((t[..., 0] & 0x0F) | (t[..., 1] << 4)).astype(np.int8).T)


def write_awq_checkpoint(src, out, group: int, *, seed: int = 0, shared_pre_scale: bool = True) -> dict:
    """AWQ-quantize a float checkpoint's linear layers as ModelOpt stores them (a random pre-quant scale per layer
    input, shared by fc and gate; fp16 scales); return the float matrix each layer computes with."""
    shutil.copytree(src, out)
    tensors = load_file(out / "rank0.safetensors")
    rng = np.random.default_rng(seed)
    pre_scales, effective = {}, {}
    for name in [n for n in tensors if n.endswith(LINEAR_SUFFIXES)]:
        w = tensors[name].float().numpy()
        rows, k = w.shape
        key = name.replace(".mlp.gate.", ".mlp.fc.") if shared_pre_scale else name
        pre = pre_scales.setdefault(key, rng.uniform(0.5, 2.0, k).astype(np.float16).astype(np.float32))
        scaled = w / pre[None, :]
        scales = (np.abs(scaled.reshape(rows, k // group, group)).max(-1) / 7).astype(np.float16).astype(np.float32)
        codes = np.clip(np.rint(scaled / np.repeat(scales, group, 1)), -8, 7).astype(np.int8)
        base = name[:-len("weight")]
        tensors[name] = torch.from_numpy(modelopt_pack(codes))
        tensors[f"{base}weights_scaling_factor"] = torch.from_numpy(scales).half()
        tensors[f"{base}prequant_scaling_factor"] = torch.from_numpy(pre).half()
        effective[name] = codes.astype(np.float32) * np.repeat(scales, group, 1) * pre[None, :]
    save_file(tensors, out / "rank0.safetensors")
    config = json.loads((out / "config.json").read_text())
    config["quantization"] = {"quant_algo": "W4A16_AWQ", "kv_cache_quant_algo": None, "group_size": group,
                              "exclude_modules": ["lm_head"]}
    (out / "config.json").write_text(json.dumps(config))
    return effective


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_trtllm_checkpoints(tmp_path_factory.mktemp("awq"), MODEL, ("none", "medusa"))


def test_unpacking_inverts_modelopts_packing():
    codes = np.random.default_rng(0).integers(-8, 8, (6, 10)).astype(np.int8)
    assert np.array_equal(unpack_codes(torch.from_numpy(modelopt_pack(codes))), codes)


def test_the_checkpoint_reads_dequantized(ckpts, tmp_path):
    """The reader's view of an AWQ weight is codes x group scales x pre-quant scale (what the GPU kernel computes
    with); the scale tensors are not listed as tensors of their own."""
    effective = write_awq_checkpoint(ckpts["none"], tmp_path / "awq", group=32)
    ckpt = read_trtllm_checkpoint(tmp_path / "awq")
    for name, w in effective.items():
        assert np.allclose(ckpt.tensor(name).numpy(), w, rtol=1e-6, atol=1e-7), name
    assert not [n for n in ckpt.names() if n.endswith("scaling_factor")]
    q, k, v = ckpt.split_qkv("transformer.layers.1.attention.qkv.weight")
    assert q.shape == (128, 128) and k.shape == v.shape == (64, 128)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_an_awq_checkpoint_builds_from_its_own_codes(ckpts, tmp_path, group):
    """The layers keep the checkpoint's codes and scales (blocks = its groups), the pre-quant scale multiplies the
    activation: the accuracy-level-1 twins match the reference reading the dequantized weights at the fp32
    tolerance; ngram speculation equals plain greedy output."""
    write_awq_checkpoint(ckpts["none"], tmp_path / "awq", group=group)
    m = build(BuildOptions(source=tmp_path / "awq", out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           max_draft_len=8))
    assert m.weights.linear == WeightFormat(dtype="int4", block_size=group, accuracy_level=4,
                                            prequantized="W4A16_AWQ")
    assert m.weights.lm_head == WeightFormat(dtype="int4", block_size=32, accuracy_level=4)
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    assert "from W4A16_AWQ" in CliRunner().invoke(cli, ["inspect", str(tmp_path / "e")]).output
    engine = OrtEngine(tmp_path / "e", threads=1)
    rng = np.random.default_rng(group)
    for _ in range(4):
        prompt = np.tile(rng.integers(0, MODEL.vocab_size, 4), 5)
        plain = generate(engine, prompt, make_proposer("none", engine), GenerationConfig(max_tokens=20)).output_ids
        spec = generate(engine, prompt, make_proposer("ngram", engine), GenerationConfig(max_tokens=20))
        assert spec.output_ids == plain


def test_a_dropped_pre_quant_scale_fails_the_numerics_check(ckpts, tmp_path, monkeypatch):
    """The graphs are checked against the reference reading the dequantized view (whose unpacking the test above
    checks against independently packed codes): a graph that forgot the pre-quant scale fails the build."""
    import trtspec.model.onnx_ops as onnx_ops

    write_awq_checkpoint(ckpts["none"], tmp_path / "awq", group=32)
    original = onnx_ops.WeightFile.add_prequantized

    def without_pre_scale(self, name, m, accuracy_level, *, row_scale=None, pre_scale=None):
        original(self, name, m, accuracy_level, row_scale=row_scale)

    monkeypatch.setattr(onnx_ops.WeightFile, "add_prequantized", without_pre_scale)
    with pytest.raises(BuildError, match="differs from the torch reference with the same dequantized weights"):
        build(BuildOptions(source=tmp_path / "awq", out=tmp_path / "e", max_input_len=64, max_seq_len=160))


def test_an_awq_medusa_checkpoint_quantizes_its_heads_here(ckpts, tmp_path):
    """Medusa heads beside an AWQ base (floats: ModelOpt leaves them unquantized by default) are quantized by the
    build like any float heads; speculation stays lossless."""
    write_awq_checkpoint(ckpts["medusa"], tmp_path / "awq", group=64)
    m = build(BuildOptions(source=tmp_path / "awq", out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           choices="[[0],[1],[0,0]]"))
    assert m.weights.drafter == WeightFormat(dtype="int4", block_size=32, accuracy_level=4)
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    engine = OrtEngine(tmp_path / "e", threads=1)
    from trtspec.speculative.tree import build_tree

    prompt = np.arange(3, 30)
    plain = generate(engine, prompt, make_proposer("none", engine), GenerationConfig(max_tokens=16)).output_ids
    spec = generate(engine, prompt, make_proposer("medusa", engine, tree=build_tree([[0], [1], [0, 0]]), backoff=False),
                    GenerationConfig(max_tokens=16))
    assert spec.output_ids == plain


def test_awq_bad_input_is_one_line(ckpts, tmp_path):
    write_awq_checkpoint(ckpts["none"], tmp_path / "a", group=32)
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "a"), "--out", str(tmp_path / "e"), "--weights", "int8"])
    assert result.exit_code == 1 and "asks for quant_algo=W4A16_AWQ (int4 weights)" in result.output
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config["quantization"]["group_size"] = 256
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(cli, ["build", str(tmp_path / "a"), "--out", str(tmp_path / "e")])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"error: {tmp_path / 'a' / 'config.json'}: quantization.group_size=256: W4A16_AWQ groups become MatMulNBits "
        "blocks, which take 32, 64, 128; re-export with --awq_block_size 128 (or 64)"]
    config["quantization"]["group_size"] = 64  # the tensors say 32
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    with pytest.raises(BuildError, match="has groups of 32 inputs; config.json quantization.group_size says 64"):
        build(BuildOptions(source=tmp_path / "a", out=tmp_path / "e", max_input_len=64, max_seq_len=160))
    write_awq_checkpoint(ckpts["none"], tmp_path / "b", group=32, shared_pre_scale=False)
    with pytest.raises(BuildError, match="mlp.fc and .mlp.gate have different prequant_scaling_factor"):
        build(BuildOptions(source=tmp_path / "b", out=tmp_path / "e", max_input_len=64, max_seq_len=160))
    assert not (tmp_path / "e").exists()


def test_awq_with_tensor_parallel_ranks_is_refused(ckpts, tmp_path):
    write_awq_checkpoint(ckpts["none"], tmp_path / "a", group=32)
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    config["mapping"] = {"world_size": 2, "tp_size": 2, "pp_size": 1}
    (tmp_path / "a" / "config.json").write_text(json.dumps(config))
    shutil.copy(tmp_path / "a" / "rank0.safetensors", tmp_path / "a" / "rank1.safetensors")
    with pytest.raises(CheckpointError, match="quant_algo=W4A16_AWQ with tp_size=2: trtspec reads AWQ checkpoints "
                                              "exported with tp_size 1"):
        read_trtllm_checkpoint(tmp_path / "a")


def test_inspect_names_the_checkpoints_quantization(ckpts, tmp_path):
    write_awq_checkpoint(ckpts["none"], tmp_path / "awq", group=32)
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path / "awq")])
    assert result.exit_code == 0 and "quantization               W4A16_AWQ, group_size 32" in result.output
