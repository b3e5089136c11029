"""`trtspec build --weights int4 --int4-scheme min`: int4 blocks with a float minimum each (llama.cpp's Q4_1), run
as symmetric MatMulNBits plus the activations' block sums times the blocks' float16 offsets (trtspec's
AddBlockOffsets): the round trip, the graph against the dequantized weights, the tied embedding, the manifest record, lossless speculation and bad input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from trtspec import native
from trtspec.cli import cli
from trtspec.engine.manifest import EngineWeights, Manifest, WeightFormat, read_manifest
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.errors import BuildError, ConfigError
from trtspec.model.onnx_ops import Graph, WeightFile, embed, linear, tie_quantized
from trtspec.model.quantize import QuantScheme, QuantSpec, dequantize, fake_quantize, quantize
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.tree import build_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64, tie_word_embeddings=True)
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"
MIN = WeightFormat(dtype="int4", block_size=32, accuracy_level=4, scheme="min")


def _q4_1_grid(rng, n: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Weights on a Q4_1 grid (what a GGUF dequantizes to): codes 0..15 with both ends used, fp16 scales and minima."""
    u = rng.integers(0, 16, (n, k // 32, 32))
    u[..., 0], u[..., 1] = 0, 15
    d = rng.uniform(0.001, 0.05, (n, k // 32)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.5, 0.1, (n, k // 32)).astype(np.float16).astype(np.float32)
    return (u * d[..., None] + m[..., None]).astype(np.float32).reshape(n, k), u, d, m


def test_q4_1_weights_come_back_to_the_offsets_float16_rounding():
    """Codes, scales and minima come back exactly; the engine adds each block's offset m + 8 d in float16, so a
    weight is off by at most that rounding (2^-11 of the offset) plus float32 arithmetic."""
    w, u, d, m = _q4_1_grid(np.random.default_rng(0), 48, 256)
    q = quantize(w, 4, 32, QuantScheme.MIN)
    assert np.array_equal(q.scales, d) and np.array_equal(q.mins, m)
    codes = np.stack([q.packed & 0x0F, q.packed >> 4], axis=-1).reshape(u.shape)
    assert np.array_equal(codes, u)
    assert np.array_equal(q.offsets, (m + 8 * d).astype(np.float16).astype(np.float32))
    assert not np.array_equal(q.offsets, m + 8 * d)  # this grid's offsets are not all halves: the rounding is seen
    bound = np.repeat(np.abs(m + 8 * d) * 2.0**-11, 32, axis=1) + 1e-6
    assert np.all(np.abs(dequantize(q) - w) <= bound)
    sym = fake_quantize(w, 4, 32)  # the symmetric scheme re-rounds that grid
    assert np.abs(sym - w).max() > 100 * np.abs(dequantize(q) - w).max() + 1e-3


def test_offsets_of_centred_q4_1_blocks_are_halves():
    """A real Q4_1 block's minimum is about -8 d (SmolLM2-135M's: |m + 8 d| a median 1 d), so m + 8 d of two halves
    is itself a half: such blocks come back exactly."""
    rng = np.random.default_rng(5)
    d = rng.uniform(0.001, 0.05, (64, 4)).astype(np.float16).astype(np.float32)
    m = (-(8 + rng.integers(-2, 3, (64, 4))) * d).astype(np.float16).astype(np.float32)
    u = rng.integers(0, 16, (64, 4, 32))
    u[..., 0], u[..., 1] = 0, 15
    w = (u * d[..., None] + m[..., None]).astype(np.float32).reshape(64, 128)
    q = quantize(w, 4, 32, QuantScheme.MIN)
    assert np.array_equal(q.offsets, m + 8 * d)
    assert np.abs(dequantize(q) - w).max() <= 1e-6


def test_the_min_scheme_is_at_most_half_a_step_off_on_any_weights():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((32, 128), dtype=np.float32) * 0.1
    q = quantize(w, 4, 64, "min")
    step = np.repeat(q.scales, 64, axis=1)
    rounding = np.repeat(np.abs(q.mins + 8 * q.scales) * 2.0**-11, 64, axis=1)  # the float16 offsets
    assert np.all(np.abs(dequantize(q) - w) <= step / 2 + rounding + 1e-7)
    flat = np.zeros((2, 64), np.float32)  # a constant block: scale 0, exact
    assert np.array_equal(dequantize(quantize(flat + 0.25, 4, 32, "min")), flat + 0.25)


@pytest.mark.parametrize("bad", [dict(bits=8, block_size=32), dict(bits=4, block_size=64)])
def test_the_min_scheme_refuses_what_it_cannot_store(bad):
    w = np.zeros((4, 96), np.float32)
    with pytest.raises(ValueError):
        quantize(w, bad["bits"], bad["block_size"], "min")
    with pytest.raises(ValueError, match="min scheme"):
        QuantSpec("int8", 32, scheme="min")


def _run(tmp_path, build_graph, inputs, outputs, feeds, level: int = 1):
    """A one-graph model over a WeightFile the `build_graph(g)` callback fills and wires; run at accuracy `level`."""
    import onnx
    import onnxruntime as ort

    wf = WeightFile(tmp_path / "w.bin")
    g = Graph(wf)
    build_graph(g)
    wf.close()
    model = g.model("t", inputs, outputs)
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "accuracy_level":
                attr.i = level
    onnx.save_model(model, str(tmp_path / "t.onnx"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    native.register(options)
    session = ort.InferenceSession(str(tmp_path / "t.onnx"), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("block_size", [32, 64])
def test_the_graph_computes_with_the_dequantized_weights(tmp_path, block_size):
    """MatMulNBits (symmetric codes) then AddBlockOffsets (block sums @ float16 offsets) equals x @ dequantize(W).T
    (level 1, fp32), for activations of rank 3; level 4 stays close. Each product is those two nodes."""
    rng = np.random.default_rng(block_size)
    w1, w2 = (rng.standard_normal((n, 192), dtype=np.float32) * 0.05 for n in (80, 48))
    spec = QuantSpec("int4", block_size, scheme="min")
    x = rng.standard_normal((2, 5, 192), dtype=np.float32)
    x[..., [3, 100]] *= 30
    info = helper.make_tensor_value_info

    def wire(g):
        g.weights.add_matrix("a.weight", w1, spec, fp32_layout="in_out", row_scale=np.full(80, 0.5, np.float32))
        g.weights.add_matrix("b.weight", w2, spec, fp32_layout="in_out")
        linear(g, "x", "a", "ya")
        linear(g, "x", "b", "yb")

    for level, tolerance in ((1, 1e-5), (4, 5e-2)):  # level 4: int8 activation blocks, outliers included
        ya, yb = _run(tmp_path, wire, [info("x", TensorProto.FLOAT, [2, 5, 192])],
                      [info("ya", TensorProto.FLOAT, [2, 5, 80]), info("yb", TensorProto.FLOAT, [2, 5, 48])],
                      {"x": x}, level)
        ref_a = x @ (0.5 * fake_quantize(w1, 4, block_size, "min")).T
        ref_b = x @ fake_quantize(w2, 4, block_size, "min").T
        assert np.abs(ya - ref_a).max() < tolerance * np.abs(ref_a).max()
        assert np.abs(yb - ref_b).max() < tolerance * np.abs(ref_b).max()
    wf = WeightFile(tmp_path / "w2.bin")
    g = Graph(wf)
    wire(g)
    assert [(n.op_type, n.domain) for n in g.nodes] == [("MatMulNBits", "com.microsoft"),
                                                        ("AddBlockOffsets", "com.trtspec")] * 2
    offsets = [n for n in g.nodes if n.op_type == "AddBlockOffsets"]
    assert [list(n.input[1:]) for n in offsets] == [["x", "a.weight.offsets"], ["x", "b.weight.offsets"]]
    assert g.used["a.weight.offsets"].data_type == TensorProto.FLOAT16
    assert list(g.used["b.weight.offsets"].dims) == [192 // block_size, 48]


def test_a_tied_embedding_gathers_rows_with_their_minima(tmp_path):
    rng = np.random.default_rng(3)
    table = rng.standard_normal((40, 96), dtype=np.float32) - 0.3
    ids = np.array([[0, 7, 39], [5, 5, 12]], np.int64)
    info = helper.make_tensor_value_info

    def wire(g):
        g.weights.add_matrix("lm_head.weight", table, QuantSpec("int4", 32, scheme="min"), fp32_layout="out_in")
        assert tie_quantized(g.weights)
        g.op("Identity", embed(g, "input_ids", tied=True), name="rows")

    (rows,) = _run(tmp_path, wire, [info("input_ids", TensorProto.INT64, [2, 3])],
                   [info("rows", TensorProto.FLOAT, [2, 3, 96])], {"input_ids": ids})
    expected = fake_quantize(table, 4, 32, "min")[ids]
    assert np.abs(rows - expected).max() < 1e-6


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_trtllm_checkpoints(tmp_path_factory.mktemp("minckpts"), MODEL)


@pytest.fixture(scope="module")
def engines(ckpts, tmp_path_factory):
    """int4 min engines: plain (K = 8 for ngram), Medusa and EAGLE (heads quantized too)."""
    root = tmp_path_factory.mktemp("minengines")
    out = {}
    for name, extra in (("none", {"max_draft_len": 8}), ("medusa", {"choices": TREE}), ("eagle", {"choices": TREE})):
        out[name] = root / name
        build(BuildOptions(source=ckpts[name], out=out[name], max_input_len=64, max_seq_len=160, weights="int4",
                           int4_scheme="min", **extra))
    return out


def test_the_build_matches_the_reference_and_records_the_scheme(engines):
    for name in ("none", "medusa", "eagle"):
        m = read_manifest(engines[name])
        assert m.numerics and max(m.numerics.values()) < NUMERICS_TOLERANCE
        assert (m.weights.linear, m.weights.lm_head, m.weights.embedding) == (MIN, MIN, MIN)
        assert m.weights.drafter == (None if name == "none" else MIN)
        assert m.to_dict()["weights"]["linear"]["scheme"] == "min"
        assert Manifest.from_dict(m.to_dict()) == m
    result = CliRunner().invoke(cli, ["inspect", str(engines["medusa"])])
    assert result.exit_code == 0, result.output
    assert "linear: int4 (block 32, with block minima, accuracy level 4)" in result.output
    assert "TreeAttention, PromptAttention, AddBlockOffsets (trtspec/native" in result.output
    symmetric = WeightFormat(dtype="int4", block_size=32, accuracy_level=4)
    written = EngineWeights(linear=symmetric).to_dict()
    assert written["linear"]["scheme"] == "symmetric" and EngineWeights.from_dict(written, "w").linear == symmetric
    with pytest.raises(ConfigError, match=r"^w.linear: missing keys 'prequantized', 'scheme'$"):
        EngineWeights.from_dict({**written, "linear": {"dtype": "int4", "block_size": 32, "accuracy_level": 4}}, "w")
    with pytest.raises(ConfigError, match="weight scheme min: int4 only, not int8"):
        WeightFormat(dtype="int8", block_size=32, accuracy_level=4, scheme="min")


def test_block_minima_need_the_compiled_ops_with_either_attention(engines, ckpts, tmp_path, monkeypatch):
    """A min engine's products end in AddBlockOffsets, so its sessions load trtspec's library whatever the attention
    kernel: the manifest says which ops; without the library a GroupQueryAttention min build stops before it writes
    anything, naming the setup script, and the engine fails to load in the same one line."""
    from trtspec.errors import NativeLibraryError

    assert read_manifest(engines["none"]).native_ops == (native.TREE_ATTENTION, native.PROMPT_ATTENTION,
                                                         native.ADD_BLOCK_OFFSETS)
    gqa = build(BuildOptions(source=ckpts["none"], out=tmp_path / "gqa", max_input_len=64, max_seq_len=160,
                             max_draft_len=4, weights="int4", int4_scheme="min", attention="gqa"))
    assert gqa.native_ops == (native.ADD_BLOCK_OFFSETS,)
    assert OrtEngine(tmp_path / "gqa", threads=1).manifest.native_ops == gqa.native_ops  # loads, with the library
    symmetric = build(BuildOptions(source=ckpts["none"], out=tmp_path / "sym", max_input_len=64, max_seq_len=160,
                                   weights="int4", attention="gqa"))
    assert symmetric.native_ops == ()
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "missing" / "libtrtspec_ops.so")
    with pytest.raises(NativeLibraryError, match="scripts/setup.sh"):
        build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights="int4", int4_scheme="min", attention="gqa"))
    assert not (tmp_path / "e").exists()
    with pytest.raises(NativeLibraryError, match="scripts/setup.sh"):
        OrtEngine(tmp_path / "gqa", threads=1)
    OrtEngine(tmp_path / "sym", threads=1)  # needs none of it


def test_an_int8_lm_head_keeps_its_symmetric_blocks(ckpts, tmp_path):
    m = build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights="int4", lm_head_weights="int8", int4_scheme="min"))
    assert m.weights.linear == MIN and m.weights.lm_head == WeightFormat(dtype="int8", block_size=32, accuracy_level=4)
    assert max(m.numerics.values()) < NUMERICS_TOLERANCE


def test_the_numerics_check_catches_wrong_minima(ckpts, tmp_path, monkeypatch):
    import trtspec.model.onnx_ops as onnx_ops

    def shifted(weight, bits, block_size, scheme="symmetric"):
        m = quantize(weight, bits, block_size, scheme)
        return dataclasses.replace(m, mins=m.mins + 0.05)

    monkeypatch.setattr(onnx_ops, "quantize", shifted)
    with pytest.raises(BuildError, match="differs from the torch reference with the same dequantized weights"):
        build(BuildOptions(source=ckpts["none"], out=tmp_path / "e", max_input_len=64, max_seq_len=160,
                           weights="int4", int4_scheme="min"))


def _prompts(n, seed):
    rng = np.random.default_rng(seed)
    return [np.tile(rng.integers(0, MODEL.vocab_size, int(rng.integers(2, 6))), 6)[:40] if i % 2
            else rng.integers(0, MODEL.vocab_size, int(rng.integers(1, 40))) for i in range(n)]


def _proposer(method, engine, backoff=False):
    """The method's whole tree every step (backoff False: the random drafters' trees would rest), or backed off."""
    if method in ("medusa", "eagle", "hybrid"):
        return make_proposer(method, engine, tree=build_tree(eval(TREE)), backoff=backoff)
    return make_proposer(method, engine, backoff=backoff)


@pytest.mark.parametrize("name,method", [("none", "ngram"), ("none", "suffix"), ("medusa", "medusa"),
                                         ("eagle", "eagle"), ("medusa", "hybrid")])
def test_speculation_equals_plain_greedy_output(engines, name, method):
    engine = OrtEngine(engines[name], threads=1)
    # TreeAttention (the default for quantized weights): trees verify exactly; plain steps of 1 slot where this CPU
    # computes one row as two
    assert not engine.chains_only and engine._min_slots in (1, 2)
    config = GenerationConfig(max_tokens=30)
    prompts = _prompts(10, seed=len(method))
    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    spec = [generate(engine, p, _proposer(method, engine), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.draft_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, _proposer(method, engine), config) for p in prompts],
                             max_batch_size=4)
    assert [r.output_ids for r in batched] == plain


def test_the_slots_of_a_chain_compute_exactly_as_plain_steps(engines):
    engine = OrtEngine(engines["none"], threads=1)
    prompt, draft = np.array([3, 1, 4, 1, 5, 9, 2, 6]), np.array([5, 3, 5, 8, 9, 7, 9, 3, 2])
    one = (np.zeros(1, np.int64), np.ones((1, 1), bool))
    seq = engine.open()
    engine.prefill(seq, prompt)
    chain = engine.verify(seq, draft, np.arange(9), np.tril(np.ones((9, 9), bool)))
    engine.close(seq)
    seq = engine.open()
    engine.prefill(seq, prompt)
    for k in range(9):
        plain = engine.verify(seq, draft[k:k + 1], *one)
        engine.commit(seq, (0,))
        assert np.array_equal(chain.logits[k], plain.logits[0]), k
    engine.close(seq)


@pytest.mark.parametrize("args,message", [
    (["--weights", "int8", "--int4-scheme", "min"],
     "--int4-scheme min: applies to int4 weights (--weights int4 or --lm-head-weights int4), not --weights int8 "
     "with an int8 lm_head"),
    (["--int4-scheme", "min"], "--int4-scheme min: applies to int4 weights"),
    (["--weights", "int4", "--int4-scheme", "asym"],
     "--int4-scheme asym: unknown int4 scheme; choose one of symmetric, min"),
    (["--weights", "int4", "--int4-scheme", "min", "--block-size", "128"],
     "--int4-scheme min: hidden_size 64 is not a multiple of --block-size 128 (the min scheme needs whole blocks); "
     "pass a --block-size that divides it"),
    (["--backend", "trtllm", "--weights", "int4", "--int4-scheme", "min"],
     "--int4-scheme applies to --backend onnx only"),
])
def test_bad_scheme_flags_are_one_line_errors(ckpts, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--out", str(tmp_path / "e"), *args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    if "--backend" in args:  # a usage error: click's usage lines, then the one-line message
        lines = lines[-1:]
    assert len(lines) == 1 and message in lines[0], result.output
    assert "Traceback" not in result.output and not (tmp_path / "e").exists()


@pytest.mark.slow
def test_smollm2_min_scheme_holds_its_q4_1_layers_and_speculates_losslessly(tmp_path):
    """SmolLM2-135M-Instruct (its float weights are a Q4_1 GGUF dequantized) as int4 min with an int8 lm_head (about
    2 min on 2 cores): its linear layers come back (these two exactly; of all 106M weights, 64 in two blocks whose
    offset m + 8 d is not a half are off by 0.3% of a step), the numerics check passes, and ngram equals plain greedy
    decoding on real prompts, in flight."""
    from safetensors.numpy import load_file

    from trtspec import ConvertOptions, convert
    from trtspec.data.prompts import load_prompts
    from trtspec.hub.fetch import fetch_model
    from trtspec.runtime.generator import LocalGenerator

    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt"), show_progress=False)
    tensors = load_file(str(tmp_path / "ckpt" / "rank0.safetensors"))
    for name in ("transformer.layers.0.attention.qkv.weight", "transformer.layers.29.mlp.proj.weight"):
        assert np.array_equal(fake_quantize(tensors[name], 4, 32, "min"), tensors[name]), name
    m = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "e", max_input_len=768, max_seq_len=1024,
                           max_draft_len=16, weights="int4", lm_head_weights="int8", int4_scheme="min"))
    assert m.weights.linear == MIN and max(m.numerics.values()) < NUMERICS_TOLERANCE
    prompts = [p.text for s in ("code-edit", "mt-bench") for p in load_prompts(s, limit=3)]
    generator = LocalGenerator(tmp_path / "e", threads=2)
    config = GenerationConfig(max_tokens=96, end_id=generator.manifest.model.end_id)
    plain = [r.output_ids for r in generator.generate_many(prompts, dataclasses.replace(config, no_spec=True))]
    spec = generator.generate_many(prompts, dataclasses.replace(config, method="ngram"))
    assert [r.output_ids for r in spec] == plain
    # one at a time, drafts pay more than in a batch of 6 (where the engine's verify curve makes ngram draft little)
    alone = [generator.generate(p, dataclasses.replace(config, method="ngram")) for p in prompts[:3]]
    assert [r.output_ids for r in alone] == plain[:3]
    assert sum(r.result.stats.accepted_tokens for r in alone) > 20


def test_bench_labels_name_the_scheme(engines):
    from trtspec.bench.compare import format_label
    from trtspec.bench.quality import WEIGHT_PARTS

    m = read_manifest(engines["none"])
    assert format_label(m.to_dict()["weights"]) == "int4 b32 min"
    assert format_label(m.to_dict()["weights"], WEIGHT_PARTS) == "int4 b32 min"  # bench quality's label
    assert format_label(EngineWeights(linear=MIN, lm_head=WeightFormat(dtype="int8", block_size=32,
                                                                       accuracy_level=4)).to_dict()) \
        == "int4 b32 min, lm_head int8 b32"
