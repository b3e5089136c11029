"""ReDrafter on the CPU engine (issue 35): a ReDrafter checkpoint (`convert --redrafter`) built by the onnx backend
runs its drafter's beam search and verifies the merged beams in one step, lossless against plain decoding of the same
engine, one prompt at a time and batched in flight, from the library, `generate` and the served CPU flavour."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.checkpoint.convert import ConvertOptions, convert
from trtspec.cli import cli
from trtspec.engine.manifest import Method
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime import LocalGenerator
from trtspec.speculative import GenerationConfig
from trtspec.testing import TinyModel, write_hf_base, write_redrafter_drafter, write_tiny_tokenizer

PROMPTS = [[1, 5, 9, 12, 40], [3, 3, 3, 3, 3, 3, 7], [20, 21, 22, 20, 21, 22, 20], [7]]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Two ReDrafter engines over one tiny LLaMA: 3 beams x 3 tokens with the recurrence and no input projection;
    2 x 4 without the recurrence, through an input projection (exit_dim 96)."""
    root = tmp_path_factory.mktemp("redrafter-cpu")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    model = TinyModel(vocab_size=vocab)
    base = write_hf_base(root / "base", model)
    out = {"root": root}
    for name, drafter, beams in (("rnn", {"rnn": True}, (3, 3)), ("proj", {"rnn": False, "exit_dim": 96}, (2, 4))):
        ckpt = root / f"ckpt-{name}"
        drafter_dir = write_redrafter_drafter(root / f"drafter-{name}", model, **drafter)
        convert(ConvertOptions(base=base, out=ckpt, redrafter=drafter_dir, redrafter_num_beams=beams[0],
                               redrafter_draft_len_per_beam=beams[1]),
                show_progress=False)
        build(BuildOptions(source=ckpt, out=root / name, tokenizer=root / "tokenizer", max_input_len=64,
                           max_seq_len=160, max_batch_size=4))
        out[name] = root / name
    return out


@pytest.mark.parametrize("name,k", [("rnn", 9), ("proj", 8)])
def test_the_engine_is_a_redrafter_engine_whose_drafter_matches_the_reference(engines, name, k):
    generator = LocalGenerator(engines[name], threads=1)
    m = generator.manifest
    assert m.method is Method.REDRAFTER and m.profile.max_draft_len == k
    assert m.redrafter["num_beams"] * m.redrafter["draft_len_per_beam"] == k
    assert "redrafter" in m.files and m.numerics["redrafter.logits"] < 1e-3
    assert "redrafter" in m.runnable_methods() and "hybrid" not in m.runnable_methods()


@pytest.mark.parametrize("name", ["rnn", "proj"])
def test_greedy_output_is_plain_decoding_of_the_same_engine(engines, name):
    generator = LocalGenerator(engines[name], threads=1)
    plain = [generator.generate(p, GenerationConfig(max_tokens=40, no_spec=True)).output_ids for p in PROMPTS]
    for backoff in (False, True):
        config = GenerationConfig(max_tokens=40, backoff=backoff)  # the engine's own method: redrafter
        results = [generator.generate(p, config) for p in PROMPTS]
        assert [r.output_ids for r in results] == plain
        if not backoff:  # every step verified a merged tree of the beams
            assert all(r.result.stats.draft_tokens > r.result.stats.steps for r in results)
    batched = generator.generate_many(PROMPTS, GenerationConfig(max_tokens=40, backoff=False))
    assert [g.output_ids for g in batched] == plain


def test_generate_cli_runs_the_method(engines, tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"input_ids": [1, 5, 9, 12, 40]}) + "\n")
    result = CliRunner().invoke(cli, ["generate", str(engines["rnn"]), "--prompts", str(tmp_path / "p.jsonl"),
                                      "--max-tokens", "16", "--method", "redrafter", "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout.splitlines()[0])
    plain = LocalGenerator(engines["rnn"], threads=1).generate([1, 5, 9, 12, 40],
                                                               GenerationConfig(max_tokens=16, no_spec=True))
    assert row["output_ids"] == plain.output_ids


@pytest.mark.slow
def test_the_cpu_flavour_serves_it(engines, tmp_path):
    """Deployed with its own method, served for real: the reply is the plain greedy one, and it drafted."""
    from trtspec.testing.grpc_requests import grpc_tensor, stream_once
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    result = CliRunner().invoke(cli, ["deploy", str(engines["rnn"]), "--out", str(tmp_path / "repo"), "--threads", "1",
                                      "--no-backoff"])  # a random drafter: back-off would rest
    assert result.exit_code == 0, result.output
    plain = LocalGenerator(engines["rnn"], threads=1).generate(PROMPTS[0], GenerationConfig(max_tokens=24,
                                                                                          no_spec=True))
    options = ServerOptions(repository=tmp_path / "repo", grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as server:
        inputs = [grpc_tensor("input_ids", np.array([PROMPTS[0]], np.int32)),
                  grpc_tensor("input_lengths", np.array([[len(PROMPTS[0])]], np.int32)),
                  grpc_tensor("request_output_len", np.array([[24]], np.int32)),
                  grpc_tensor("exclude_input_in_output", np.array([[True]], bool))]
        got = stream_once(server.grpc_url, "tensorrt_llm", inputs)
    assert [str(e) for _, e in got if e is not None] == []
    ids = np.concatenate([r.as_numpy("output_ids").reshape(-1) for r, _ in got if r is not None]).tolist()
    assert ids == plain.output_ids
    drafted = [int(r.as_numpy("num_draft_tokens").reshape(-1)[0]) for r, _ in got if r is not None]
    assert max(drafted) > 0


def test_an_lm_head_with_zero_trailing_columns_is_read_in_part(tmp_path):
    """A drafter whose lm_head is zero past its first hidden columns (as `train redrafter` writes one) builds a graph
    that reads only those columns, checked against the full reference; quantized, whole blocks of them."""
    import onnx
    from safetensors.torch import load_file, save_file

    from trtspec.model.onnx_graph import redrafter_lm_head_columns
    from trtspec.model.quantize import QuantSpec

    lm = np.zeros((8, 128), np.float32)
    lm[:, :40] = 1.0
    assert redrafter_lm_head_columns(lm, None) == 40
    assert redrafter_lm_head_columns(lm, QuantSpec("int8", 32)) == 64
    assert redrafter_lm_head_columns(np.ones((8, 128), np.float32), None) == 128
    vocab = write_tiny_tokenizer(tmp_path / "tokenizer")
    model = TinyModel(vocab_size=vocab)
    drafter = write_redrafter_drafter(tmp_path / "drafter", model, num_draft_layers=1)
    state = load_file(str(drafter / "model.safetensors"))
    state["lm_head.1.weight"][:, model.hidden_size:] = 0
    save_file(state, str(drafter / "model.safetensors"))
    convert(ConvertOptions(base=write_hf_base(tmp_path / "base", model), out=tmp_path / "ckpt", redrafter=drafter,
                           redrafter_num_beams=2, redrafter_draft_len_per_beam=2), show_progress=False)
    m = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "engine", tokenizer=tmp_path / "tokenizer",
                           max_input_len=64, max_seq_len=160))
    assert m.numerics["redrafter.logits"] < 1e-3
    graph = onnx.load(str(tmp_path / "engine" / "redrafter.onnx"), load_external_data=False)
    assert "Slice" in {node.op_type for node in graph.graph.node}
    generator = LocalGenerator(tmp_path / "engine", threads=1)
    plain = generator.generate(PROMPTS[0], GenerationConfig(max_tokens=24, no_spec=True)).output_ids
    assert generator.generate(PROMPTS[0], GenerationConfig(max_tokens=24, backoff=False)).output_ids == plain
