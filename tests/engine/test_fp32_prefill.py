"""`trtspec build --weights int8|int4 --fp32-prefill`: the context graph reads fp32 copies of the dequantized linear
layers (the values MatMulNBits computes with), the generation graph still reads the blocks, the manifest records it,
speculation stays lossless, and the flag is refused where it means nothing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import numpy_helper

from tests.engine.test_awq import write_awq_checkpoint
from trtspec.cli import cli
from trtspec.engine.manifest import Manifest, WeightFormat, read_manifest
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.tree import build_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64, tie_word_embeddings=True)
TREE = "[[0],[1],[0,0],[0,1],[0,0,0]]"
# (weights, int4 scheme) builds with --fp32-prefill
FORMATS = [("int8", None), ("int4", None), ("int4", "min")]
LAYER_MATRICES = ("qkv", "o", "gate_up", "down")


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_trtllm_checkpoints(tmp_path_factory.mktemp("prefill-ckpts"), MODEL)


@pytest.fixture(scope="module")
def engines(ckpts, tmp_path_factory):
    """(weights, scheme, name, fp32_prefill) → engine dir; name: none (K = 8), medusa, eagle."""
    root = tmp_path_factory.mktemp("prefill-engines")
    out = {}
    for weights, scheme in FORMATS:
        for name, extra in (("none", {"max_draft_len": 8}), ("medusa", {"choices": TREE}),
                            ("eagle", {"choices": TREE})):
            for prefill in (True, False):
                if not prefill and name != "none":
                    continue
                key = (weights, scheme, name, prefill)
                out[key] = root / f"{name}-{weights}-{scheme}-{prefill}"
                build(BuildOptions(source=ckpts[name], out=out[key], max_input_len=64, max_seq_len=160,
                                   weights=weights, int4_scheme=scheme, fp32_prefill=prefill, **extra))
    return out


def _initializers(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def _nodes(path) -> list[onnx.NodeProto]:
    return list(onnx.load(str(path), load_external_data=False).graph.node)


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_the_context_graph_reads_the_dequantized_blocks_as_fp32(engines, weights, scheme):
    engine = engines[weights, scheme, "none", True]
    context, generation = _initializers(engine / "context.onnx"), _initializers(engine / "generation.onnx")
    for layer in range(MODEL.num_layers):
        for matrix in LAYER_MATRICES:
            name = f"layers.{layer}.{matrix}.weight"
            copy = context[f"{name}.fp32"]  # [in, out]
            n, k = copy.shape[1], copy.shape[0]
            codes = generation[f"{name}.q"]  # [n, blocks, bytes]
            if weights == "int4":  # two codes a byte, the low nibble first
                codes = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, codes.shape[1], -1)
            half = 8 if weights == "int4" else 128
            values = (codes.astype(np.float32) - half) * generation[f"{name}.scales"].reshape(n, -1, 1)
            if scheme == "min":  # + the block's stored offset (min + 8 scale, float16), as AddBlockOffsets adds it
                values += generation[f"{name}.offsets"].T.astype(np.float32)[..., None]
            np.testing.assert_allclose(copy, values.reshape(n, -1)[:, :k].T, rtol=1e-6, atol=1e-7)
            assert f"{name}.fp32" not in generation
    # the prompt's products are fp32 MatMuls; only the lm_head (one row per prompt) stays a MatMulNBits
    nbits = [n.input[1] for n in _nodes(engine / "context.onnx") if n.op_type == "MatMulNBits"]
    assert nbits == ["lm_head.weight.q"]
    plain = engines[weights, scheme, "none", False]
    count = lambda path: sum(n.op_type == "MatMulNBits" for n in _nodes(path))  # noqa: E731
    assert count(engine / "generation.onnx") == count(plain / "generation.onnx") == 4 * MODEL.num_layers + 1


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_the_manifest_and_inspect_record_the_fp32_prefill(engines, weights, scheme):
    m = read_manifest(engines[weights, scheme, "eagle", True])
    assert m.weights.prefill == WeightFormat()
    assert m.weights.linear.dtype.value == weights
    assert m.numerics and max(m.numerics.values()) < NUMERICS_TOLERANCE
    assert Manifest.from_dict(m.to_dict()) == m
    assert read_manifest(engines[weights, scheme, "none", False]).weights.prefill is None
    result = CliRunner().invoke(cli, ["inspect", str(engines[weights, scheme, "eagle", True])])
    assert result.exit_code == 0, result.output
    assert "prefill: fp32" in result.output


def test_the_copies_cost_four_bytes_per_linear_weight(engines):
    prefill = (engines["int8", None, "none", True] / "weights.bin").stat().st_size
    plain = (engines["int8", None, "none", False] / "weights.bin").stat().st_size
    c = MODEL
    head_dim = c.hidden_size // c.num_heads
    per_layer = c.hidden_size * ((c.num_heads + 2 * c.num_kv_heads) * head_dim + c.num_heads * head_dim
                                 + 3 * c.intermediate_size)
    alignment = 64 * 4 * c.num_layers  # each copy starts on a 64-byte boundary
    assert 4 * c.num_layers * per_layer <= prefill - plain < 4 * c.num_layers * per_layer + alignment


def _prompts(n, seed):
    rng = np.random.default_rng(seed)
    return [np.tile(rng.integers(0, MODEL.vocab_size, int(rng.integers(2, 6))), 8)[:int(rng.integers(10, 40))]
            if i % 2 else rng.integers(0, MODEL.vocab_size, int(rng.integers(1, 40))) for i in range(n)]


@pytest.mark.parametrize("weights,scheme", FORMATS)
@pytest.mark.parametrize("name,method", [("none", "ngram"), ("none", "lookahead"), ("medusa", "medusa"),
                                         ("eagle", "eagle")])
def test_speculation_on_an_fp32_prefill_engine_equals_its_plain_greedy_output(engines, weights, scheme, name,
                                                                                method):
    engine = OrtEngine(engines[weights, scheme, name, True], threads=1)
    config = GenerationConfig(max_tokens=24)
    prompts = _prompts(8, seed=len(name) + len(weights))

    def proposer():
        tree = {"tree": build_tree(eval(TREE))} if method in ("medusa", "eagle") else {}
        return make_proposer(method, engine, backoff=False, **tree)

    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    spec = [generate(engine, p, proposer(), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.draft_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, proposer(), config) for p in prompts], max_batch_size=4)
    assert [r.output_ids for r in batched] == plain


def test_an_awq_checkpoint_prefills_from_its_own_codes_in_fp32(ckpts, tmp_path):
    ckpt = tmp_path / "awq"
    write_awq_checkpoint(ckpts["none"], ckpt, 32)
    m = build(BuildOptions(source=ckpt, out=tmp_path / "engine", max_input_len=64, max_seq_len=160,
                           max_draft_len=4, fp32_prefill=True))
    assert m.weights.linear.prequantized and m.weights.prefill == WeightFormat()
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE  # the pre-quant scale is applied before the fp32 product
    nodes = _nodes(tmp_path / "engine" / "context.onnx")
    assert sum(n.op_type == "Mul" and n.name.endswith("_pre_scale") for n in nodes) == 4 * MODEL.num_layers
    engine = OrtEngine(tmp_path / "engine", threads=1)
    config = GenerationConfig(max_tokens=20)
    for p in _prompts(4, seed=3):
        assert (generate(engine, p, make_proposer("ngram", engine, backoff=False), config).output_ids
                == generate(engine, p, make_proposer("none", engine), config).output_ids)


def test_fp32_prefill_on_fp32_weights_is_a_one_line_error(ckpts, tmp_path):
    with pytest.raises(ConfigError, match="--fp32-prefill: applies to quantized linear layers"):
        build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", fp32_prefill=True))
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--out", str(tmp_path / "e"), "--fp32-prefill"])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        "error: --fp32-prefill: applies to quantized linear layers (--weights int8 or int4); with --weights fp32 "
        "the prompt already runs fp32 products"]
    assert not (tmp_path / "e").exists()


def test_fp32_prefill_is_refused_on_the_trtllm_backend(ckpts, tmp_path):
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--backend", "trtllm", "--out", str(tmp_path / "e"),
                                      "--weights", "int8", "--fp32-prefill"])
    assert result.exit_code == 2
    assert "--fp32-prefill applies to --backend onnx only" in result.output
