"""`trtspec build --weights int8|int4`: MatMulNBits packing, numerics against the dequantized reference, the
manifest's weight formats, row invariance, lossless speculation on quantized engines, and bad input."""

from __future__ import annotations

import json
from dataclasses import replace
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from trtspec.cli import cli
from trtspec.engine.summary import engine_summary
from trtspec.engine.manifest import EngineWeights, Manifest, WeightFormat, read_manifest
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build, plan_build
from trtspec.errors import BuildError, ConfigError
from trtspec.model.quantize import dequantize, quantize
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.tree import build_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64, tie_word_embeddings=True)
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_trtllm_checkpoints(tmp_path_factory.mktemp("qckpts"), MODEL)


@pytest.fixture(scope="module")
def engines(ckpts, tmp_path_factory):
    """int4 / int8 engines: plain (K = 8 for ngram), Medusa and EAGLE, heads quantized too; (weights, name) as built
    by default (TreeAttention), (weights, name, "gqa") with --attention gqa (GroupQueryAttention padded to 2 rows)."""
    root = tmp_path_factory.mktemp("qengines")
    out = {}
    for weights in ("int4", "int8"):
        for name, ckpt, extra in (("none", ckpts["none"], {"max_draft_len": 8}),
                                  ("medusa", ckpts["medusa"], {"choices": TREE}),
                                  ("eagle", ckpts["eagle"], {"choices": TREE})):
            for kernel, key in (("tree", (weights, name)), ("gqa", (weights, name, "gqa"))):
                out[key] = root / f"{name}-{weights}-{kernel}"
                build(BuildOptions(source=ckpt, out=out[key], max_input_len=64, max_seq_len=160,
                                   weights=weights, attention=None if kernel == "tree" else kernel, **extra))
    return out


def _session(model):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _matmul_nbits(w: np.ndarray, bits: int, block_size: int, accuracy_level: int):
    m = quantize(w, bits, block_size)
    n, k = w.shape
    node = helper.make_node("MatMulNBits", ["A", "B", "S"], ["Y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block_size, accuracy_level=accuracy_level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
                              [numpy_helper.from_array(m.packed, "B"),
                               numpy_helper.from_array(m.scales.reshape(-1), "S")])
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
    return _session(model), dequantize(m)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("block_size", [32, 64, 128])
def test_packing_is_what_matmul_nbits_reads(bits, block_size):
    """At accuracy level 1 (fp32 compute) ONNX Runtime's product equals x @ dequantize(W).T: the layout, nibble order,
    implicit zero point and scales are the kernel's; K = 200 checks the zero-padded last block."""
    rng = np.random.default_rng(bits + block_size)
    w = rng.standard_normal((96, 200), dtype=np.float32) * 0.1
    session, dense = _matmul_nbits(w, bits, block_size, accuracy_level=1)
    x = rng.standard_normal((5, 200), dtype=np.float32)
    (y,) = session.run(None, {"A": x})
    assert np.abs(y - x @ dense.T).max() < 1e-4
    assert np.abs(dense - w).max() <= np.abs(w).max() / (2 ** (bits - 1) - 1)  # at most one step off


@pytest.mark.parametrize("bits,accuracy_level", [(4, 1), (4, 4), (8, 4)])
def test_matmul_nbits_rows_are_invariant_from_two_rows(bits, accuracy_level):
    """Each row of a 17-row product equals the same row computed in a product of 2, 3, 5 or 9 rows, bit for bit
    (activations with outlier channels, as real hidden states have). One row alone: the same for 8-bit weights at
    accuracy level 4; for 4-bit weights only on some CPUs (ONNX Runtime 1.32 takes another kernel path for one row on
    some instruction sets: seen on one host, bit-identical on an AVX-512 VNNI EPYC), which is one of the two reasons a
    quantized engine runs a plain step as 2 slots (quantize.PLAIN_STEP_SLOTS)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((192, 576), dtype=np.float32) * 0.05
    session, _ = _matmul_nbits(w, bits, 32, accuracy_level)
    x = rng.standard_normal((17, 576), dtype=np.float32)
    x[:, [5, 77, 300]] *= 200
    (full,) = session.run(None, {"A": x})
    for rows in (2, 3, 5, 9):
        for start in range(0, 17 - rows, rows):
            (part,) = session.run(None, {"A": x[start:start + rows]})
            assert np.array_equal(part, full[start:start + rows]), (rows, start)
    alone = np.stack([session.run(None, {"A": x[i:i + 1]})[0][0] for i in range(17)])
    if bits == 8:
        assert np.array_equal(alone, full)
    else:  # the one-row path may differ, within rounding (the padding to 2 slots makes that harmless)
        assert np.abs(alone - full).max() < 1e-3 * np.abs(full).max()


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_quantized_build_matches_the_dequantized_reference_and_records_formats(engines, weights):
    for name in ("none", "medusa", "eagle"):
        m = read_manifest(engines[weights, name])
        assert m.numerics and max(m.numerics.values()) < NUMERICS_TOLERANCE
        fmt = WeightFormat(dtype=weights, block_size=32, accuracy_level=4)
        assert (m.weights.linear, m.weights.lm_head) == (fmt, fmt)
        assert m.weights.embedding == fmt  # tied: gathered from the quantized lm_head (hidden 64 = 2 blocks)
        assert m.weights.drafter == (None if name == "none" else fmt)
        assert Manifest.from_dict(m.to_dict()) == m
    medusa = engine_summary(engines[weights, "medusa"])
    assert medusa["weights"]["linear"] == f"{weights} (block 32, accuracy level 4)"
    assert medusa["weights"]["drafter"] == f"{weights} (block 32, accuracy level 4)"


def test_quantized_weights_shrink_the_engine(engines, ckpts, tmp_path):
    fp32 = build(BuildOptions(source=ckpts["none"], out=tmp_path / "fp32", max_input_len=64, max_seq_len=160))
    assert fp32.weights == EngineWeights()
    sizes = {w: (engines[w, "none"] / "weights.bin").stat().st_size for w in ("int4", "int8")}
    full = (tmp_path / "fp32" / "weights.bin").stat().st_size
    assert sizes["int4"] < sizes["int8"] < full / 2


def test_inspect_shows_the_weight_formats(engines):
    result = CliRunner().invoke(cli, ["inspect", str(engines["int4", "eagle"])])
    assert result.exit_code == 0, result.output
    assert "linear: int4 (block 32, accuracy level 4)" in result.output
    assert "drafter: int4 (block 32, accuracy level 4)" in result.output


def _prompts(n, seed):
    """Random prompts, half of them repetitive so that ngram drafts."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        if i % 2:
            out.append(np.tile(rng.integers(0, MODEL.vocab_size, int(rng.integers(2, 6))), 6)[:40])
        else:
            out.append(rng.integers(0, MODEL.vocab_size, int(rng.integers(1, 40))))
    return out


def _proposer(method, engine, backoff=False):
    """The method's whole tree every step (backoff False: the random drafters' trees would rest), or backed off."""
    if method in ("medusa", "eagle", "hybrid"):
        return make_proposer(method, engine, tree=build_tree(eval(TREE)), backoff=backoff)
    return make_proposer(method, engine, backoff=backoff)


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("name,method", [("none", "ngram"), ("medusa", "medusa"), ("eagle", "eagle")])
def test_speculation_on_a_quantized_engine_equals_its_plain_greedy_output(engines, weights, name, method):
    engine = OrtEngine(engines[weights, name], threads=1)
    config = GenerationConfig(max_tokens=30)
    prompts = _prompts(12, seed=len(name))
    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    spec = [generate(engine, p, _proposer(method, engine), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.draft_tokens for r in spec) > 0  # the drafter did draft
    if method == "ngram":  # (a random tiny drafter's top-1 chain is rarely right)
        assert sum(r.stats.accepted_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, _proposer(method, engine), config) for p in prompts],
                             max_batch_size=4)
    assert [r.output_ids for r in batched] == plain
    backed_off = generate_batch(engine, [Request(p, _proposer(method, engine, backoff=True), config) for p in prompts],
                                max_batch_size=4)  # chains shrunk to their prefixes, or resting
    assert [r.output_ids for r in backed_off] == plain


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_a_plain_step_computes_a_slot_exactly_as_a_verify_step(engines, weights):
    """A quantized engine's plain steps (1 slot where this CPU's kernels compute one row as they do many, the graph
    padding attention to 2 rows; else 2 slots, the second masked): alone or batched, a sequence's next-token logits
    are bit-identical to that slot's logits in a 9-slot verify step."""
    engine = OrtEngine(engines[weights, "none"], threads=1)
    assert engine._min_slots in (1, 2)
    prompts = [np.array([3, 1, 4, 1, 5]), np.array([2, 7, 1, 8]), np.array([1, 6, 1, 8, 0, 3, 3])]
    draft = np.array([9, 2, 6, 5, 3, 5, 8, 9, 7])
    chain = np.tril(np.ones((9, 9), bool))
    seqs = [engine.open() for _ in prompts]
    for seq, prompt in zip(seqs, prompts):
        engine.prefill(seq, prompt)
    one = (np.zeros(1, np.int64), np.ones((1, 1), bool))
    batched = engine.verify_batch([(seq, draft[:1], *one) for seq in seqs])
    for seq, plain_batched in zip(seqs, batched):
        plain = engine.verify(seq, draft[:1], *one)
        verify = engine.verify(seq, draft, np.arange(9), chain)
        assert verify.slots == 9 and plain_batched.slots == 1
        assert np.array_equal(plain.logits[0], verify.logits[0])
        assert np.array_equal(plain_batched.logits[0], verify.logits[0])
    for seq in seqs:
        engine.close(seq)


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_the_generation_graph_pads_attention_so_one_slot_computes_as_two(engines, weights):
    """A quantized engine's generation graph runs attention over at least 2 rows (manifest attention_rows), padding a
    one-token step itself: fed 1 slot or 2 (the second masked), a step gives the same logits bit for bit where the
    products compute one row as they do many: the 8-bit kernels, and the 4-bit ones on some CPUs
    (test_matmul_nbits_rows_are_invariant_from_two_rows). The engine feeds 1 slot exactly when that holds."""
    manifest = read_manifest(engines[weights, "none", "gqa"])
    assert manifest.attention_rows == 2 and manifest.attention == "gqa"
    engine = OrtEngine(engines[weights, "none", "gqa"], threads=1)
    seq = engine.open()
    engine.prefill(seq, np.array([3, 1, 4, 1, 5, 9, 2, 6]))
    cache = engine._seqs[seq].base
    token, past = np.array([[5]]), np.array([cache.length], np.int32)
    one, two = (engine._generation.run_plain(token, past, cache, slots)["logits"][0, 0].copy() for slots in (1, 2))
    assert np.isfinite(one).all()
    assert engine._min_slots == (1 if np.array_equal(one, two) else 2)
    if weights == "int8":
        assert engine._min_slots == 1


@pytest.mark.parametrize("args,message", [
    (["--weights", "int4", "--block-size", "48"], "--block-size 48: unsupported block size; choose one of 32, 64, 128"),
    (["--weights", "int3"], "--weights int3: unknown weight format; choose one of fp32, int8, int4"),
    (["--block-size", "64"], "--block-size 64: applies to --weights int8 or int4, not fp32"),
    (["--weights", "int4", "--lm-head-weights", "int2"],
     "--lm-head-weights int2: unknown weight format; choose one of fp32, int8, int4"),
    (["--weights", "int4", "--block-size", "16"], "--block-size 16: unsupported block size; choose one of 32, 64, 128"),
])
def test_bad_quantization_flags_are_one_line_errors(ckpts, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--out", str(tmp_path / "e"), *args])
    assert result.exit_code != 0
    assert result.exit_code == 1 and result.output.strip().splitlines() == [f"error: {message}"]
    assert "Traceback" not in result.output and not (tmp_path / "e").exists()


def _with_quantization(src, dst, **quantization):
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization"] = {"quant_algo": None, "kv_cache_quant_algo": None, **quantization}
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def _retype(ckpt, name, dtype):
    """Rewrite one tensor of rank0.safetensors in another dtype (what a quantizing converter would have stored)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(ckpt / "rank0.safetensors")
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, ckpt / "rank0.safetensors")


@pytest.mark.parametrize("quantization,message", [
    ({"quant_algo": "W4A8_AWQ"}, "quant_algo=W4A8_AWQ: the onnx backend cannot run this quantization mode"),
    ({"quant_algo": "FP8"}, "quant_algo=FP8: the onnx backend cannot run this quantization mode"),
    ({"quant_algo": "W8A8_SQ_PER_CHANNEL"}, "quant_algo=W8A8_SQ_PER_CHANNEL: the onnx backend cannot run"),
    ({"quant_algo": "NVFP4"}, "quant_algo=NVFP4: the onnx backend cannot run this quantization mode"),
    ({"quant_algo": "SOMETHING_NEW"}, "quant_algo=SOMETHING_NEW: the onnx backend cannot run this quantization mode"),
    ({"kv_cache_quant_algo": "FP8"}, "kv_cache_quant_algo=FP8: the onnx backend keeps the KV cache in fp32"),
    ({"quant_algo": "W8A16", "kv_cache_quant_algo": "INT8"}, "kv_cache_quant_algo=INT8"),
])
def test_a_checkpoint_with_an_unknown_quantization_is_refused_naming_its_mode(ckpts, tmp_path, quantization, message):
    ckpt = _with_quantization(ckpts["none"], tmp_path / "q", **quantization)
    with pytest.raises(BuildError, match=message):
        plan_build(BuildOptions(source=ckpt, out=tmp_path / "e", max_input_len=64))
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--out", str(tmp_path / "e")])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1
    assert message.split(":")[0] in result.output and str(ckpt / "config.json") in result.output
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("algo,weights", [("W8A16", "int8"), ("W4A16", "int4")])
def test_a_weight_only_checkpoint_with_float_weights_builds_in_its_format(ckpts, tmp_path, algo, weights):
    """W8A16 / W4A16 with floating-point tensors (trtllm-build quantizes those at build time): the onnx build
    quantizes them too, in the format the mode names, unless --weights says otherwise (an error)."""
    ckpt = _with_quantization(ckpts["none"], tmp_path / "q", quant_algo=algo)
    m = build(BuildOptions(source=ckpt, out=tmp_path / "e", max_input_len=64, max_seq_len=160))
    assert m.weights.linear.dtype.value == weights and max(m.numerics.values()) < NUMERICS_TOLERANCE
    other = "int4" if weights == "int8" else "int8"
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--out", str(tmp_path / "f"), "--weights", other])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"error: --weights {other}: {ckpt / 'config.json'} asks for quant_algo={algo} ({weights} weights); pass "
        f"--weights {weights} or build from a checkpoint without quant_algo"]


def test_a_weight_only_checkpoint_with_gpu_layout_int8_tensors_is_refused(ckpts, tmp_path):
    import torch

    ckpt = _with_quantization(ckpts["none"], tmp_path / "q", quant_algo="W8A16")
    _retype(ckpt, "transformer.layers.0.mlp.fc.weight", torch.int8)
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--out", str(tmp_path / "e")])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [
        f"error: {ckpt / 'config.json'}: quant_algo=W8A16: tensor transformer.layers.0.mlp.fc.weight is already "
        "quantized in TensorRT-LLM's GPU kernel layout (convert_checkpoint.py --use_weight_only), which the onnx "
        "backend cannot read; convert without --use_weight_only and build with --weights int8"]


@pytest.mark.parametrize("name", ["medusa_heads.1.medusa_layers.0.linear.weight", "medusa_heads.0.lm_head.weight"])
def test_heads_stored_in_a_format_the_engine_cannot_run_are_refused(ckpts, tmp_path, name):
    """Medusa heads a quantizer left as int8 tensors (no quant_algo says so) would be read as floats; the build
    names the tensor and its dtype instead."""
    import torch

    ckpt = tmp_path / "q"
    shutil.copytree(ckpts["medusa"], ckpt)
    _retype(ckpt, name, torch.int8)
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--out", str(tmp_path / "e"), "--weights", "int4",
                                      "--choices", TREE, "--max-input-len", "64", "--max-seq-len", "160"])
    assert result.exit_code == 1 and result.output.strip().splitlines()[-1:] == [  # after the progress bar
        f"error: {ckpt}: tensor {name} is int8: quantized weights the onnx backend cannot read (it quantizes "
        "floating-point weights itself: --weights, --quantize-heads)"]
    assert not (tmp_path / "e").exists()


def test_heads_kept_fp32_with_no_quantize_heads(ckpts, tmp_path):
    m = build(BuildOptions(source=ckpts["medusa"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights="int8", quantize_heads=False, choices=TREE))
    assert m.weights.drafter == WeightFormat() and m.weights.linear.dtype.value == "int8"
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    with pytest.raises(ConfigError, match="--weights fp16: unknown weight format"):
        plan_build(BuildOptions(source=ckpts["none"], out=tmp_path / "f", weights="fp16"))


@pytest.mark.slow
def test_smollm2_int4_builds_and_speculates_losslessly(tmp_path):
    """SmolLM2-135M-Instruct as int4 (75 s in all on 2 shared cores): the numerics check, a quarter of the fp32 size, a
    plain step bit-identical to the verify step's slot, and ngram == plain greedy on real prompts."""
    from trtspec import ConvertOptions, convert
    from trtspec.data.prompts import load_prompts
    from trtspec.hub.fetch import fetch_model
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt"), show_progress=False)
    m = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "int4", max_input_len=256, max_seq_len=512,
                           max_draft_len=8, weights="int4"))
    assert m.weights.linear.dtype.value == "int4" and m.weights.embedding == m.weights.lm_head
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    assert (tmp_path / "int4" / "weights.bin").stat().st_size < 135e6 * 4 / 5
    engine = OrtEngine(tmp_path / "int4", threads=2)
    seq = engine.open()
    engine.prefill(seq, np.arange(100, 140))
    draft, one = np.array([9, 2, 6, 5, 3, 5, 8, 9, 7]) * 101, (np.zeros(1, np.int64), np.ones((1, 1), bool))
    plain = engine.verify(seq, draft[:1], *one)
    verify = engine.verify(seq, draft, np.arange(9), np.tril(np.ones((9, 9), bool)))
    assert np.array_equal(plain.logits[0], verify.logits[0])
    engine.close(seq)
    prompts = [p.text for p in load_prompts("mt-bench", limit=3)]
    prompts.append("Repeat this list exactly, twice: apples, pears, plums, cherries, grapes, lemons, limes, figs.")
    generator = LocalGenerator(tmp_path / "int4", threads=2)
    plain = [r.output_ids for r in generator.generate_many(prompts, GenerationConfig(max_tokens=32, no_spec=True))]
    spec = generator.generate_many(prompts, GenerationConfig(max_tokens=32, method="ngram"))
    assert [r.output_ids for r in spec] == plain


@pytest.mark.slow
def test_smollm2_int8_with_ngram_equals_plain_decoding_on_real_prompts(tmp_path):
    """SmolLM2-135M-Instruct int8 (about 2 min on 2 cores): with Token-Recycling trees ngram departed from plain
    decoding on code-edit/0 at token 24 (a near-tie, top-2 gap 0.03, that a second-branch tree slot flipped); drafting
    chains only, every reply equals plain greedy decoding, alone and batched."""
    from trtspec import ConvertOptions, convert
    from trtspec.data.prompts import load_prompts
    from trtspec.hub.fetch import fetch_model
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt"), show_progress=False)
    build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "int8", max_input_len=768, max_seq_len=1024,
                       max_draft_len=16, weights="int8"))
    prompts = [p.text for s in ("code-edit", "mt-bench") for p in load_prompts(s, limit=6)]
    generator = LocalGenerator(tmp_path / "int8", threads=2)
    config = GenerationConfig(max_tokens=128, end_id=generator.manifest.model.end_id)
    ids = [generator.encode(p) for p in prompts]
    plain = [generate(generator.engine, p, generator.proposer(replace(config, no_spec=True)), config).output_ids
             for p in ids]
    spec = [generate(generator.engine, p, generator.proposer(replace(config, method="ngram")), config) for p in ids]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.accepted_tokens for r in spec) > 100
    batched = generator.generate_many(prompts, replace(config, method="ngram"))  # in flight, 8 rows
    assert [r.output_ids for r in batched] == plain


def test_the_numerics_check_catches_a_wrong_packing(ckpts, tmp_path, monkeypatch):
    """Weights written with their nibbles swapped (what a layout bug would do) fail the build's check against the
    dequantized reference."""
    import dataclasses

    import trtspec.model.onnx_ops as onnx_ops

    def swapped(weight, bits, block_size, scheme="symmetric"):
        m = quantize(weight, bits, block_size, scheme)
        return dataclasses.replace(m, packed=((m.packed << 4) | (m.packed >> 4)).astype(np.uint8))

    monkeypatch.setattr(onnx_ops, "quantize", swapped)
    with pytest.raises(BuildError, match="differs from the torch reference with the same dequantized weights"):
        build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights="int4"))
    assert not (tmp_path / "e").exists()


def test_an_eagle_draft_with_a_reduced_vocabulary_quantizes_too(tmp_path):
    """An EAGLE-3 style draft (d2t / t2d): its lm_head rows of the draft vocabulary are quantized, the numerics check
    passes and speculation equals plain greedy output."""
    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.testing import write_eagle_draft, write_hf_base

    model = TinyModel(vocab_size=64)
    base = write_hf_base(tmp_path / "base", model)
    draft = write_eagle_draft(tmp_path / "draft", model, storage="safetensors", draft_vocab_size=24)
    convert(ConvertOptions(base=base, out=tmp_path / "ckpt", eagle=draft, num_eagle_layers=3), show_progress=False)
    m = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "e", preset="chain_3", max_input_len=32,
                           max_seq_len=96, weights="int4"))
    assert m.model.draft_vocab_size == 24 and m.weights.drafter.dtype.value == "int4"
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    engine = OrtEngine(tmp_path / "e", threads=1)
    config = GenerationConfig(max_tokens=20)
    for prompt in _prompts(6, seed=5):
        prompt = prompt[:24]
        plain = generate(engine, prompt, make_proposer("none", engine), config).output_ids
        spec = generate(engine, prompt, make_proposer("eagle", engine, tree=build_tree([[0], [0, 0], [0, 0, 0]]), backoff=False),
                        config)
        assert spec.output_ids == plain


@pytest.mark.parametrize("weights,head", [("int4", "int8"), ("int4", "fp32"), ("fp32", "int8")])
def test_lm_head_weights_apart_from_the_linear_layers(ckpts, tmp_path, weights, head):
    """--lm-head-weights: the lm_head (and the tied embedding gathering its rows) in its own format; the numerics
    check against the reference with the same mixed dequantized weights passes, plain steps stay padded to 2 slots
    where any target matrix is quantized, and ngram speculation equals plain greedy output."""
    m = build(BuildOptions(source=ckpts["medusa"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights=weights, lm_head_weights=head, choices=TREE))
    quantized = lambda dtype: WeightFormat(dtype=dtype, block_size=32, accuracy_level=4)  # noqa: E731
    fmt = lambda dtype: WeightFormat() if dtype == "fp32" else quantized(dtype)  # noqa: E731
    assert (m.weights.linear, m.weights.lm_head, m.weights.embedding) == (fmt(weights), fmt(head), fmt(head))
    assert m.weights.drafter == fmt(weights) and m.weights.min_step_slots == 2
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE
    engine = OrtEngine(tmp_path / "e", threads=1)
    config = GenerationConfig(max_tokens=20)
    for prompt in _prompts(4, seed=7):
        plain = generate(engine, prompt, make_proposer("none", engine), config).output_ids
        assert generate(engine, prompt, _proposer("medusa", engine), config).output_ids == plain


def test_the_lm_head_format_changes_only_the_lm_head(ckpts, engines, tmp_path):
    """int4 with an int8 lm_head: the layers' bytes are those of the int4 engine, the lm_head's those of int8."""
    build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160, max_draft_len=8,
                       weights="int4", lm_head_weights="int8"))
    size = lambda e: (e / "weights.bin").stat().st_size  # noqa: E731
    assert size(engines["int4", "none"]) < size(tmp_path / "e") < size(engines["int8", "none"])
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path / "e")])
    assert "lm_head: int8 (block 32, accuracy level 4)" in result.output
    assert "linear: int4 (block 32, accuracy level 4)" in result.output


def _is_chain(tree) -> bool:
    return list(tree.parents) == list(range(-1, tree.num_nodes))


def _recording(proposer, trees: list):
    """The proposer, with every draft's tree appended to `trees`."""
    propose = proposer.propose

    def record(root):
        draft = propose(root)
        trees.append(draft.tree)
        return draft

    proposer.propose = record
    return proposer


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("name,method", [("none", "ngram"), ("none", "suffix"), ("medusa", "medusa"),
                                         ("eagle", "eagle"), ("medusa", "hybrid")])
def test_a_quantized_engine_with_group_query_attention_drafts_chains_only(engines, weights, name, method):
    """Only a chain's slots compute exactly as plain steps on a quantized engine built with --attention gqa, so every
    drafter drafts chains there, and stays lossless; lookahead (a tree by construction) is refused in one line."""
    engine = OrtEngine(engines[weights, name, "gqa"], threads=1)
    assert engine.chains_only and "lookahead" not in engine.manifest.runnable_methods()
    config = GenerationConfig(max_tokens=30)
    trees = []
    for prompt in _prompts(6, seed=3):
        plain = generate(engine, prompt, make_proposer("none", engine), config).output_ids
        assert generate(engine, prompt, _recording(_proposer(method, engine), trees), config).output_ids == plain
    drafted = [t for t in trees if t.num_nodes]
    assert drafted and all(_is_chain(t) for t in drafted)
    if method != "ngram":  # ngram drafts only what pays; the others draft their tree's depth (or the drafter's)
        assert max(t.num_nodes for t in drafted) >= 2
    with pytest.raises(ConfigError, match="lookahead verifies a tree"):
        make_proposer("lookahead", engine)


def test_an_fp32_engine_drafts_trees(engines, ckpts, tmp_path):
    """fp32 engines verify tree slots alike (to 2e-5 in the logits), so their drafters keep their trees."""
    out = tmp_path / "fp32"
    build(BuildOptions(source=ckpts["medusa"], out=out, max_input_len=64, max_seq_len=160, choices=TREE))
    engine = OrtEngine(out, threads=1)
    assert not engine.chains_only and "lookahead" in engine.manifest.runnable_methods()
    assert not _is_chain(_proposer("medusa", engine).tree)


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("kernel", ["tree", "gqa"])
def test_the_slots_of_a_chain_compute_exactly_as_plain_steps(engines, weights, kernel):
    """What drafting chains relies on: slot k of a 9-slot chain step has the logits a plain step after the chain's
    first k tokens has, bit for bit, and so does the leading chain of a tree laid out first (either kernel)."""
    engine = OrtEngine(engines[(weights, "none") + (() if kernel == "tree" else ("gqa",))], threads=1)
    prompt, draft = np.array([3, 1, 4, 1, 5, 9, 2, 6]), np.array([5, 3, 5, 8, 9, 7, 9, 3, 2])
    one = (np.zeros(1, np.int64), np.ones((1, 1), bool))

    def plain_after(tokens):
        seq = engine.open()
        engine.prefill(seq, prompt)
        for token in tokens:
            out = engine.verify(seq, np.array([token]), *one)
            engine.commit(seq, (0,))
        engine.close(seq)
        return out.logits[0]

    seq = engine.open()
    engine.prefill(seq, prompt)
    chain = engine.verify(seq, draft, np.arange(9), np.tril(np.ones((9, 9), bool)))
    # a tree: the chain's first 4 slots, then a branch below the root and one below slot 1
    parents = [-1, 0, 1, 2, 0, 1]
    depths, mask = np.zeros(6, np.int64), np.eye(6, dtype=bool)
    for i in range(1, 6):
        depths[i], mask[i] = depths[parents[i]] + 1, mask[parents[i]]
        mask[i, i] = True
    tree = engine.verify(seq, np.array([5, 3, 5, 8, 11, 12]), depths, mask)
    engine.close(seq)
    for k in range(9):
        assert np.array_equal(chain.logits[k], plain_after(draft[:k + 1])), k
    for k in range(4):
        assert np.array_equal(tree.logits[k], plain_after(draft[:k + 1])), k


def test_deploying_lookahead_on_a_quantized_gqa_engine_is_a_one_line_error(engines, tmp_path):
    result = CliRunner().invoke(cli, ["deploy", str(engines["int8", "none", "gqa"]), "--out", str(tmp_path / "repo"),
                                      "--method", "lookahead"])
    assert result.exit_code == 1, result.output
    assert "lookahead" in result.output and "quantized" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "repo").exists()


@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_every_slot_of_a_tree_computes_exactly_as_plain_steps_with_tree_attention(engines, weights):
    """TreeAttention (the default for quantized weights): a slot anywhere in a tree, second branches included, has
    the logits plain steps along its path have, bit for bit, alone and batched with other sequences."""
    manifest = read_manifest(engines[weights, "none"])
    assert manifest.attention == "tree" and manifest.attention_rows == 1 and not manifest.chains_only
    engine = OrtEngine(engines[weights, "none"], threads=1)
    # plain steps feed one slot where this CPU's int4 kernels compute one row as they do several, else two (the
    # engine checks at load); either way every slot below must equal plain steps bit for bit
    assert engine._min_slots in (1, manifest.weights.min_step_slots) and not engine.chains_only
    prompts = [np.array([3, 1, 4, 1, 5, 9, 2, 6]), np.array([2, 7, 1, 8, 2, 8])]
    tokens = np.array([5, 3, 11, 8, 12, 9, 13, 7])
    parents = [-1, 0, 0, 1, 2, 2, 4, 3]  # branches below the root, below slot 2, a leaf at depth 3 on each side
    depths, mask = np.zeros(8, np.int64), np.eye(8, dtype=bool)
    for i in range(1, 8):
        depths[i], mask[i] = depths[parents[i]] + 1, mask[parents[i]]
        mask[i, i] = True
    one = (np.zeros(1, np.int64), np.ones((1, 1), bool))

    def plain_along(prompt, slot):
        path = []
        while slot >= 0:
            path.insert(0, slot)
            slot = parents[slot]
        seq = engine.open()
        engine.prefill(seq, prompt)
        for s in path:
            out = engine.verify(seq, tokens[s:s + 1], *one)
            engine.commit(seq, (0,))
        engine.close(seq)
        return out.logits[0]

    seqs = [engine.open() for _ in prompts]
    for seq, prompt in zip(seqs, prompts):
        engine.prefill(seq, prompt)
    alone = engine.verify(seqs[0], tokens, depths, mask)
    engine.close(seqs[0])
    seqs[0] = engine.open()
    engine.prefill(seqs[0], prompts[0])
    batched = engine.verify_batch([(seq, tokens, depths, mask) for seq in seqs])
    for seq in seqs:
        engine.close(seq)
    for slot in range(8):
        expected = plain_along(prompts[0], slot)
        assert np.array_equal(alone.logits[slot], expected), slot
        assert np.array_equal(batched[0].logits[slot], expected), slot
        assert np.array_equal(batched[1].logits[slot], plain_along(prompts[1], slot)), slot


@pytest.mark.parametrize("weights", ["int4", "int8"])
@pytest.mark.parametrize("name,method", [("none", "ngram"), ("none", "lookahead"), ("medusa", "medusa"),
                                         ("eagle", "eagle"), ("medusa", "hybrid")])
def test_a_quantized_engine_with_tree_attention_drafts_trees_losslessly(engines, weights, name, method):
    """With TreeAttention every drafter keeps its trees on a quantized engine (lookahead included), and speculation
    equals plain greedy decoding, alone and batched."""
    engine = OrtEngine(engines[weights, name], threads=1)
    assert not engine.chains_only and "lookahead" in engine.manifest.runnable_methods()
    config = GenerationConfig(max_tokens=30)
    trees, prompts = [], _prompts(6, seed=5)
    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    assert [generate(engine, p, _recording(_proposer(method, engine), trees), config).output_ids
            for p in prompts] == plain
    batched = generate_batch(engine, [Request(p, _proposer(method, engine), config) for p in prompts],
                             max_batch_size=4)
    assert [r.output_ids for r in batched] == plain
    if method != "ngram":  # ngram drafts a tree only when no long match is found; the others draft theirs
        assert any(not _is_chain(t) for t in trees if t.num_nodes)


def test_attention_kernel_flag(ckpts, tmp_path):
    """--attention: tree (the default, any weights) or gqa; anything else is a one-line error."""
    def plan(**options):
        return plan_build(BuildOptions(source=ckpts["none"], out=tmp_path / "a", max_input_len=64, **options))

    assert (plan().attention, plan(weights="int8").attention) == ("tree", "tree")
    assert plan(weights="int8").attention_rows == 1 and not plan(weights="int8").chains_only
    m = plan(weights="int8", attention="gqa")
    assert (m.attention, m.attention_rows, m.chains_only) == ("gqa", 2, True)
    m = plan(attention="gqa")
    assert (m.attention, m.attention_rows, m.chains_only) == ("gqa", 1, False)  # fp32: trees, to ~2e-5
    assert m.to_dict()["attention"] == "gqa" and m.to_dict()["attention_rows"] == 1
    with pytest.raises(ConfigError, match="--attention 'flash'"):
        plan(attention="flash")
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--out", str(tmp_path / "b"), "--attention", "x"])
    assert result.exit_code == 2 and "--attention" in result.output


def test_a_tree_attention_build_without_the_native_library_fails_first(ckpts, tmp_path, monkeypatch):
    """Without trtspec's compiled ops a TreeAttention build stops before it writes anything, naming the setup
    script; --attention gqa still builds; an engine that needs the library fails to load in the same one line."""
    from trtspec import native
    from trtspec.errors import NativeLibraryError

    built = build(BuildOptions(source=ckpts["none"], out=tmp_path / "tree", max_input_len=64, max_seq_len=160))
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "missing" / "libtrtspec_ops.so")
    with pytest.raises(NativeLibraryError, match="scripts/setup.sh"):
        build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160))
    assert not (tmp_path / "e").exists()
    assert build(BuildOptions(source=ckpts["none"], out=tmp_path / "g", max_input_len=64, max_seq_len=160,
                              attention="gqa")).attention == "gqa"
    assert built.attention == "tree"
    with pytest.raises(NativeLibraryError, match="scripts/setup.sh"):
        OrtEngine(tmp_path / "tree", threads=1)
