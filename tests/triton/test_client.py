"""The gRPC client speaks to both flavours: it adapts its request tensors to the ensemble's declared inputs."""

from __future__ import annotations

import pytest

from trtspec.errors import ConfigError, ServerError
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.ngram_proposer import NgramConfig
from trtspec.speculative.sampling import SamplingParams
from trtspec.triton.client import build_inputs
from trtspec.triton.contract import client_inputs, cpu_ensemble_inputs


def _names(inputs) -> dict:
    return {t.name(): t.datatype() for t in inputs}


def test_cpu_flavour_gets_trtspec_inputs():
    accepted = {t.name for t in cpu_ensemble_inputs()}
    names = _names(build_inputs("hi", GenerationConfig(sampling=SamplingParams(seed=3), no_spec=True), stream=True, accepted=accepted))
    assert names["random_seed"] == "UINT64" and names["use_speculation"] == "BOOL"
    assert names["text_input"] == "BYTES" and names["max_tokens"] == "INT32" and "return_perf_metrics" not in names
    assert set(names) <= accepted and "draft_method" not in names
    names = _names(build_inputs("hi", GenerationConfig(method="ngram"), stream=True, accepted=accepted))
    assert names["draft_method"] == "BYTES"


@pytest.mark.parametrize("newest", [False, True])
def test_gpu_flavour_gets_its_spelling_and_perf_metrics(newest):
    accepted = {t.name for t in client_inputs(newest_names=newest)} | {"return_perf_metrics"}
    names = _names(build_inputs("hi", GenerationConfig(sampling=SamplingParams(seed=3)), stream=True, accepted=accepted))
    assert ("seed" in names) == newest and ("random_seed" in names) == (not newest)
    assert names["return_perf_metrics"] == "BOOL" and set(names) <= accepted
    with pytest.raises(ServerError, match="no use_speculation input"):
        build_inputs("hi", GenerationConfig(no_spec=True), stream=True, accepted=accepted)
    with pytest.raises(ServerError, match="no draft_method input"):
        build_inputs("hi", GenerationConfig(method="ngram"), stream=True, accepted=accepted)


@pytest.mark.parametrize("field,value", [("min_tokens", 3), ("ngram", NgramConfig()), ("stop_words", ((5,),))])
def test_a_setting_the_request_cannot_carry_is_refused(field, value):
    with pytest.raises(ConfigError, match=f"^{field}=.*the gRPC client does not send it"):
        build_inputs("hi", GenerationConfig(**{field: value}), stream=True)


@pytest.mark.parametrize("url,address", [("localhost", "localhost:8001"), ("10.0.0.2:9001", "10.0.0.2:9001"),
                                         ("[::1]", "[::1]:8001"), ("[::1]:7001", "[::1]:7001"), ("::1", "[::1]:8001")])
def test_a_url_without_a_port_gets_serves_grpc_port(url, address):
    from trtspec.triton.client import TritonClient, grpc_address

    assert grpc_address(url) == address
    assert TritonClient(url, connection=object()).url == address


def test_the_default_grpc_port_is_serves():
    from trtspec.cli import cli
    from trtspec.triton.client import GRPC_PORT
    from trtspec.triton.server import ServerOptions

    serve = {p.name: p.default for p in cli.commands["serve"].params}
    assert GRPC_PORT == ServerOptions.__dataclass_fields__["grpc_port"].default == serve["grpc_port"] == 8001
    assert f"serve's default gRPC port, {GRPC_PORT}" in " ".join(
        next(p.help for p in cli.commands["generate"].params if p.name == "url").split())
