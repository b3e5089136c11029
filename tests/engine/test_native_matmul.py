"""`trtspec build --weights int8|int4 --native-matmul`: every quantized product of the target's graphs (decoder layers
and lm_head, prompt and decode steps) runs trtspec's BlockMatMul over the same blocks (no extra weights), the drafter
keeps MatMulNBits, the manifest and inspect record it, the graphs compute the numbers MatMulNBits does, a plain step
feeds one slot, speculation stays lossless, and the flag is refused where it means nothing."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

# the same tiny model, formats, layer matrices and prompts as the --fp32-prefill tests
from tests.engine.test_fp32_prefill import FORMATS, LAYER_MATRICES, MODEL, TREE, _prompts
from trtspec.cli import cli
from trtspec.engine.manifest import Manifest, read_manifest
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.native import BLOCK_MATMUL, SKIP_RMS_NORM
from trtspec.runtime.ort_engine import OrtEngine, _Cache, _feeds
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.tree import build_tree
from trtspec.testing import tiny_trtllm_checkpoints


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    return tiny_trtllm_checkpoints(tmp_path_factory.mktemp("native-matmul-ckpts"), MODEL)


@pytest.fixture(scope="module")
def engines(ckpts, tmp_path_factory):
    """(weights, scheme, name, native) → engine dir; name: none (K = 8) or eagle."""
    root = tmp_path_factory.mktemp("native-matmul-engines")
    out = {}
    for weights, scheme in FORMATS:
        for name, extra in (("none", {"max_draft_len": 8}), ("eagle", {"choices": TREE})):
            for native in (True, False):
                if not native and name != "none":
                    continue
                key = (weights, scheme, name, native)
                out[key] = root / f"{name}-{weights}-{scheme}-{native}"
                build(BuildOptions(source=ckpts[name], out=out[key], max_input_len=64, max_seq_len=160,
                                   weights=weights, int4_scheme=scheme, native_matmul=native, **extra))
    return out


def _nodes(path) -> list[onnx.NodeProto]:
    return list(onnx.load(str(path), load_external_data=False).graph.node)


def _native_counterpart(nodes: list[onnx.NodeProto], *, gated: bool) -> list[str]:
    """The op types of a MatMulNBits graph's nodes but its products, SkipRMSNorm for its
    SkipSimplifiedLayerNormalization, and if `gated`, without each layer's Split-Sigmoid-Mul-Mul after gate_up."""
    ops, skip = [], 0
    for node in nodes:
        if gated and node.op_type == "Split" and node.name.endswith(".gate_up_split"):
            skip = 4
        if skip:
            assert node.op_type == ("Split", "Sigmoid", "Mul", "Mul")[4 - skip]
            skip -= 1
        elif node.op_type != "MatMulNBits":
            ops.append(SKIP_RMS_NORM if node.op_type == "SkipSimplifiedLayerNormalization" else node.op_type)
    return ops


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_the_target_graphs_run_blockmatmul_over_the_same_blocks(engines, weights, scheme):
    engine, plain = engines[weights, scheme, "none", True], engines[weights, scheme, "none", False]
    for graph in ("context.onnx", "generation.onnx"):
        nodes = _nodes(engine / graph)
        assert [n.input[1] for n in nodes if n.op_type == BLOCK_MATMUL] == [
            f"layers.{layer}.{m}.weight.q" for layer in range(MODEL.num_layers)
            for m in LAYER_MATRICES] + ["lm_head.weight.q"]
        assert not any(n.op_type == "MatMulNBits" for n in nodes)
        # gate_up computes silu(gate) · up in its own tiles, where no min-scheme offsets follow the product
        gated = [n.input[1] for n in nodes if n.op_type == BLOCK_MATMUL
                 and any(a.name == "gated" and a.i == 1 for a in n.attribute)]
        assert gated == ([] if scheme == "min" else [f"layers.{layer}.gate_up.weight.q"
                                                     for layer in range(MODEL.num_layers)])
        # otherwise the plain build's graph, node for node, its norms trtspec's, less its SwiGLU nodes where gated
        assert SKIP_RMS_NORM in {n.op_type for n in nodes}
        assert ([n.op_type for n in nodes if n.op_type != BLOCK_MATMUL]
                == _native_counterpart(_nodes(plain / graph), gated=bool(gated)))
    assert (engine / "weights.bin").stat().st_size == (plain / "weights.bin").stat().st_size
    # the EAGLE draft is the drafter's own network: it keeps MatMulNBits
    draft = _nodes(engines[weights, scheme, "eagle", True] / "draft_generation.onnx")
    assert any(n.op_type == "MatMulNBits" for n in draft) and not any(n.op_type == BLOCK_MATMUL for n in draft)


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_the_manifest_and_inspect_record_it(engines, weights, scheme):
    m = read_manifest(engines[weights, scheme, "eagle", True])
    assert m.matmul_kernel == "block" and {BLOCK_MATMUL, SKIP_RMS_NORM} <= set(m.native_ops)
    assert m.numerics and max(m.numerics.values()) < NUMERICS_TOLERANCE
    assert Manifest.from_dict(m.to_dict()) == m
    plain = read_manifest(engines[weights, scheme, "none", False])
    assert plain.matmul_kernel == "matmulnbits" and BLOCK_MATMUL not in plain.native_ops
    result = CliRunner().invoke(cli, ["inspect", str(engines[weights, scheme, "eagle", True])])
    assert result.exit_code == 0, result.output
    assert "BlockMatMul over the blocks" in result.output


def test_an_unknown_matmul_kernel_is_refused_in_one_line(engines):
    data = read_manifest(engines["int8", None, "none", True]).to_dict()
    data["matmul_kernel"] = "fancy"
    with pytest.raises(ConfigError, match="matmul_kernel 'fancy' is not a kernel this trtspec runs"):
        Manifest.from_dict(data)


def _engine_cache_prompt(engine_dir, rows: int, *, seed: int, length: int):
    """The engine, a scratch cache of `rows` rows and a random prompt of `length` token ids."""
    engine = OrtEngine(engine_dir, threads=2)
    m = engine.manifest.model
    cache = _Cache.allocate(m.num_layers, rows, m.num_kv_heads, m.head_dim)
    return engine, cache, np.random.default_rng(seed).integers(0, m.vocab_size, length)


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_the_prompt_computes_what_matmulnbits_computes(engines, weights, scheme):
    """The same prompt through both builds' context graphs: the same logits and cache rows up to the order of the
    float sums (and a rare activation rounding tie)."""
    outputs = []
    for native in (True, False):
        engine, cache, prompt = _engine_cache_prompt(engines[weights, scheme, "none", native], 48, seed=5, length=37)
        out = engine._context.run(_feeds(prompt, 0), cache)
        outputs.append((out["logits"].copy(), cache.kv[:, :, 0, :, :37].copy()))
    (logits, kv), (logits_ref, kv_ref) = outputs
    assert np.abs(logits - logits_ref).max() <= 1e-2 * np.abs(logits_ref).max()
    assert np.abs(kv - kv_ref).max() <= 1e-2 * np.abs(kv_ref).max()


@pytest.mark.parametrize("weights,scheme", FORMATS)
def test_a_decode_step_computes_what_matmulnbits_computes_and_one_slot_is_exact(engines, weights, scheme):
    """A verify step of 6 chained slots after the same prompt through both builds' generation graphs: the same logits
    up to the order of the float sums. And on the BlockMatMul build a plain step feeds one slot: its row is
    bit-identical to the same token as the first of many slots (BlockMatMul and TreeAttention compute a row alike in
    calls of any size), so plain steps need no padding."""
    outputs = []
    for native in (True, False):
        engine, cache, prompt = _engine_cache_prompt(engines[weights, scheme, "none", native], 64, seed=6, length=29)
        engine._context.run(_feeds(prompt[:23], 0), cache)
        tokens, n = prompt[23:], 6
        feeds = {"input_ids": tokens[None], "past_lengths": np.array([23], np.int32),
                 "position_ids": (23 + np.arange(n))[None], "tree_mask": np.tril(np.ones((n, n), bool))[None]}
        outputs.append(engine._generation.run(feeds, cache)["logits"][0].copy())
        if native:
            assert engine._min_slots == 1
            one = engine._generation.run_plain(tokens[None, :1], np.array([23], np.int32), cache, 1)["logits"]
            assert np.array_equal(one[0, 0], outputs[0][0])
    assert np.abs(outputs[0] - outputs[1]).max() <= 1e-2 * np.abs(outputs[1]).max()


@pytest.mark.parametrize("weights,scheme", FORMATS)
@pytest.mark.parametrize("name,method", [("none", "ngram"), ("eagle", "eagle")])
def test_speculation_equals_its_plain_greedy_output(engines, weights, scheme, name, method):
    engine = OrtEngine(engines[weights, scheme, name, True], threads=1)
    config = GenerationConfig(max_tokens=24)
    prompts = _prompts(8, seed=len(name) + len(weights))

    def proposer():
        tree = {"tree": build_tree(eval(TREE))} if method == "eagle" else {}
        return make_proposer(method, engine, backoff=False, **tree)

    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    spec = [generate(engine, p, proposer(), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.draft_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, proposer(), config) for p in prompts], max_batch_size=4)
    assert [r.output_ids for r in batched] == plain


@pytest.mark.parametrize("args,message", [
    ([], "--native-matmul: applies to quantized linear layers (--weights int8 or int4), not --weights fp32"),
    (["--weights", "int8", "--fp32-prefill"], "--native-matmul and --fp32-prefill: choose one"),
    (["--weights", "int8", "--block-size", "64"], "--native-matmul: BlockMatMul runs blocks of 32; --block-size is 64"),
])
def test_what_it_cannot_build_is_one_line(ckpts, tmp_path, args, message):
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--out", str(tmp_path / "e"), "--native-matmul",
                                      *args])
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {message}"), result.output
    assert not (tmp_path / "e").exists()


def test_it_is_refused_on_the_trtllm_backend(ckpts, tmp_path):
    result = CliRunner().invoke(cli, ["build", str(ckpts["none"]), "--backend", "trtllm", "--out", str(tmp_path / "e"),
                                      "--weights", "int8", "--native-matmul"])
    assert result.exit_code == 2
    assert "--native-matmul applies to --backend onnx only" in result.output


def test_a_cpu_without_avx512_vnni_is_told_once_when_the_engine_loads(engines, monkeypatch, caplog):
    from trtspec import native

    monkeypatch.setattr(native, "block_matmul_vectorized", lambda: False)
    with caplog.at_level("WARNING", logger="trtspec.runtime.ort_engine"):
        OrtEngine(engines["int8", None, "none", True], threads=1)
        OrtEngine(engines["int8", None, "none", False], threads=1)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "portable loop on this CPU (no AVX-512 VNNI)" in warnings[0]


def test_an_awq_checkpoint_in_groups_other_than_32_is_refused_in_one_line(ckpts, tmp_path):
    from tests.engine.test_awq import write_awq_checkpoint

    write_awq_checkpoint(ckpts["none"], tmp_path / "awq", 64)
    with pytest.raises(ConfigError, match="^--native-matmul: BlockMatMul runs blocks of 32; the checkpoint's linear "
                                          "layers keep groups of 64$"):
        build(BuildOptions(source=tmp_path / "awq", out=tmp_path / "e", max_draft_len=4, native_matmul=True))
    assert not (tmp_path / "e").exists()



def test_the_step_benchmark_prints_each_engine_against_the_first(engines):
    """benchmarks/engine_steps.py: a prompt and verify steps of each engine, each in its own process; no times
    asserted, only that every cell of both engines ran and the first engine is the 1.00x row."""
    from benchmarks.engine_steps import main

    native, plain = engines["int8", None, "none", True], engines["int8", None, "none", False]
    result = CliRunner().invoke(main, [str(native), str(plain), "--slots", "1,3", "--past", "20", "--prompt", "12",
                                       "--rounds", "1", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line.split()[1:] for line in result.output.splitlines()[2:]}
    assert set(rows) == {native.name, plain.name}
    assert rows[native.name][1::2] == ["(1.00x)"] * 3 and len(rows[plain.name]) == 6

@pytest.mark.slow
@pytest.mark.parametrize("weights", ["int4", "int8"])
def test_smollm2_with_blockmatmul_speculates_losslessly_on_real_prompts(tmp_path, weights):
    """SmolLM2-135M-Instruct with every product on BlockMatMul (about 2 min a format on 2 cores): a plain step of
    one slot is bit-identical to the first slot of a 9-slot verify step, and ngram and suffix equal plain greedy
    decoding on real code-edit and mt-bench prompts, alone and batched."""
    from dataclasses import replace

    from trtspec import ConvertOptions, convert
    from trtspec.data.prompts import load_prompts
    from trtspec.hub.fetch import fetch_model
    from trtspec.runtime.generator import LocalGenerator

    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt"), show_progress=False)
    m = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "e", max_input_len=768, max_seq_len=1024,
                           max_draft_len=15, weights=weights, native_matmul=True))
    assert m.matmul_kernel == "block" and max(m.numerics.values()) < NUMERICS_TOLERANCE
    generator = LocalGenerator(tmp_path / "e", threads=2)
    engine = generator.engine
    assert engine._min_slots == 1
    seq = engine.open()
    engine.prefill(seq, np.arange(100, 140))
    draft = np.array([9, 2, 6, 5, 3, 5, 8, 9, 7]) * 101
    plain_step = engine.verify(seq, draft[:1], np.zeros(1, np.int64), np.ones((1, 1), bool))
    verify_step = engine.verify(seq, draft, np.arange(9), np.tril(np.ones((9, 9), bool)))
    assert np.array_equal(plain_step.logits[0], verify_step.logits[0])
    engine.close(seq)
    prompts = [p.text for s in ("code-edit", "mt-bench") for p in load_prompts(s, limit=5)]
    config = GenerationConfig(max_tokens=96, end_id=generator.manifest.model.end_id)
    plain = [r.output_ids for r in generator.generate_many(prompts, replace(config, no_spec=True))]
    for method in ("ngram", "suffix"):
        ids = [generator.encode(p) for p in prompts]
        alone = [generate(engine, p, generator.proposer(replace(config, method=method)), config) for p in ids]
        assert [r.output_ids for r in alone] == plain, method
        assert sum(r.stats.accepted_tokens for r in alone) > 50, method
        batched = generator.generate_many(prompts, replace(config, method=method))
        assert [r.output_ids for r in batched] == plain, method
