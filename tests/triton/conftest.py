"""A tiny Medusa engine with a real (tiny) tokenizer, its CPU-flavour repository, and a real tritonserver."""

from __future__ import annotations

import pytest

from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer
from trtspec.triton.deploy import DeployOptions, deploy
from trtspec.triton.server import ServerOptions, TritonServer, free_port


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("triton-engine")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("medusa",))["medusa"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=64, max_seq_len=160, max_batch_size=8,
                       tokenizer=root / "tokenizer"))
    return root / "engine"


@pytest.fixture(scope="session")
def tiny_repo(tiny_engine, tmp_path_factory):
    return deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path_factory.mktemp("repos") / "repo", threads=1))


@pytest.fixture(scope="session")
def server(tiny_repo):
    """The real server on free loopback ports; always stopped."""
    options = ServerOptions(repository=tiny_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as running:
        yield running
