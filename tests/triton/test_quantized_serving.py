"""A quantized engine (int4 target and Medusa heads) deployed and served by the real tritonserver: gRPC replies, plain
and speculative, equal in-process generation token for token; `generate --json` and `inspect` show the format."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer
from trtspec.triton.client import TritonClient
from trtspec.triton.deploy import DeployOptions, deploy
from trtspec.triton.server import ServerOptions, TritonServer, free_port

PROMPTS = ["Hello world speculative decoding", "Medusa heads tokens", "the quick brown fox the quick brown fox",
           "def f(x): return x * 2"]
INT4 = "int4 (block 32, accuracy level 4)"


@pytest.fixture(scope="module")
def int4_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("int4-serving")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab, tie_word_embeddings=True),
                                   ("medusa",))["medusa"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=64, max_seq_len=160, weights="int4",
                       tokenizer=root / "tokenizer"))
    return root / "engine"


def test_generate_json_and_inspect_show_the_weight_format(int4_engine):
    result = CliRunner().invoke(cli, ["generate", str(int4_engine), "--prompt", PROMPTS[0], "--max-tokens", "6",
                                      "--json", "--threads", "1"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.output.strip().splitlines()[-1])
    assert record["weights"] == {"linear": INT4, "lm_head": INT4, "embedding": INT4, "drafter": INT4}
    assert len(record["output_ids"]) == 6
    summary = json.loads(CliRunner().invoke(cli, ["inspect", str(int4_engine), "--json"]).output)
    assert summary["weights"]["linear"] == INT4


def test_a_served_int4_engine_answers_as_in_process(int4_engine, tmp_path):
    repo = deploy(DeployOptions(engine_dir=int4_engine, out=tmp_path / "repo", threads=1))
    local = LocalGenerator(int4_engine, threads=1)
    options = ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(), metrics_port=free_port(),
                            exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as running, TritonClient(running.grpc_url) as client:
        for i, prompt in enumerate(PROMPTS):
            for opts in (GenerationConfig(max_tokens=24), GenerationConfig(max_tokens=24, no_spec=True),
                         GenerationConfig(max_tokens=24, method="ngram")):
                remote = client.generate(prompt, opts, index=i)
                expected = local.generate(prompt, opts, index=i)
                assert remote.output_ids == expected.output_ids, (prompt, opts)
                assert remote.text == expected.text
        medusa = client.generate(PROMPTS[2], GenerationConfig(max_tokens=24), index=0)
        plain = local.generate(PROMPTS[2], GenerationConfig(max_tokens=24, no_spec=True))
        assert medusa.output_ids == plain.output_ids  # lossless over the wire too


def test_doctor_shows_a_cpu_engines_weight_format(int4_engine, tmp_path):
    from trtspec.triton.doctor import doctor

    repo = deploy(DeployOptions(engine_dir=int4_engine, out=tmp_path / "repo", threads=1))
    assert [(f.severity, f.field, f.message) for f in doctor(repo) if f.field != "request tensors"] == [
        ("note", "weights", f"linear {INT4}, lm_head {INT4}, embedding {INT4}, drafter {INT4}")]
