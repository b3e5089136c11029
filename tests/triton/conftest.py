"""A tiny Medusa engine with a real (tiny) tokenizer, its CPU-flavour repository, and a real tritonserver."""

from __future__ import annotations

import pytest

from trtspec.testing import TinyModel
from trtspec.testing import tiny_engine as build_tiny_engine
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.server import ServerOptions, TritonServer, free_port


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    return build_tiny_engine(tmp_path_factory.mktemp("triton-engine"), max_input_len=64, max_seq_len=160, max_batch_size=8)


@pytest.fixture(scope="session")
def long_engine(tmp_path_factory):
    """A small model with room for 1,500-token answers: requests that run for half a minute (cancellation tests,
    and a request held in flight while others arrive). Its steps (~20 ms) are slower than the ensemble's
    per-response path (~2.6 ms on 2 cores), as a real model's are: with the tiny model the engine runs ahead of its
    streams and a cancellation is seen only after the backlog."""
    root = tmp_path_factory.mktemp("triton-long")
    model = TinyModel(hidden_size=512, num_layers=4, num_heads=8, num_kv_heads=4, intermediate_size=2048,
                      max_position_embeddings=2048)
    return build_tiny_engine(root, model, max_input_len=64, max_seq_len=1600, max_batch_size=8)


@pytest.fixture(scope="session")
def long_repo(long_engine):
    return deploy(DeployOptions(engine_dir=long_engine, out=long_engine.parent / "repo", threads=1))


CORPUS_PROMPTS = ("Medusa heads tokens", "quick brown fox the target model", "speculative decoding Hello world")


@pytest.fixture(scope="session")
def tiny_datastore(tiny_engine, tmp_path_factory):
    """The tiny engine's own greedy replies to CORPUS_PROMPTS as a suffix datastore (what method suffix looks up)."""
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.datastore import Datastore

    local = LocalGenerator(tiny_engine, threads=1)
    replies = [g.output_ids for g in local.generate_many(list(CORPUS_PROMPTS),
                                                         GenerationConfig(max_tokens=48, no_spec=True))]
    path = tmp_path_factory.mktemp("datastore") / "replies.ds"
    Datastore.from_documents(replies, vocab_size=local.manifest.model.vocab_size).save(path)
    return path


@pytest.fixture(scope="session")
def tiny_repo(tiny_engine, tiny_datastore, tmp_path_factory):
    # whole trees (no back-off): the random heads' drafts would rest, and these tests count drafts and acceptance
    return deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path_factory.mktemp("repos") / "repo", threads=1,
                                datastore=tiny_datastore, backoff=False))


@pytest.fixture(scope="session")
def server(tiny_repo):
    """The real server on free loopback ports; always stopped."""
    options = ServerOptions(repository=tiny_repo, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port(), exit_timeout_s=5)
    with TritonServer(options, on_log=lambda line: None) as running:
        yield running
