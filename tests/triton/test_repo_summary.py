"""`trtspec inspect REPO` describes Triton model repositories of either flavour."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions


def test_a_cpu_flavour_repository_is_described(tiny_engine, tmp_path):
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo", method="ngram", threads=2))
    result = CliRunner().invoke(cli, ["inspect", str(repo), "--json"])
    assert result.exit_code == 0, result.output
    facts = json.loads(result.stdout)
    assert facts["flavour"] == "cpu" and facts["engine"] == str(tiny_engine.resolve())
    assert facts["method"] == "ngram" and facts["threads"] == "2"
    assert set(facts["models"]) == {"ensemble", "preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm_bls"}
    assert facts["models"]["tensorrt_llm"].startswith("python, max_batch_size 8, decoupled")
    text = CliRunner().invoke(cli, ["inspect", str(repo)]).stdout
    assert text.splitlines()[0] == f"{repo}: Triton model repository · cpu flavour"


def test_threads_zero_reads_all_cores(tiny_engine, tmp_path):
    """A repository deployed without --threads (threads 0: ONNX Runtime's all cores) says so."""
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo"))
    text = CliRunner().invoke(cli, ["inspect", str(repo)]).stdout
    assert "  threads                    all cores" in text.splitlines(), text
    assert json.loads(CliRunner().invoke(cli, ["inspect", str(repo), "--json"]).stdout)["threads"] == "all cores"


def test_an_upstream_layout_repository_is_described(tmp_path):
    model = tmp_path / "repo" / "tensorrt_llm"
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'name: "tensorrt_llm"\nbackend: "tensorrtllm"\nmax_batch_size: 4\n'
        'model_transaction_policy { decoupled: true }\n'
        'parameters { key: "gpt_model_path" value { string_value: "/engines/vicuna" } }\n'
        'parameters { key: "decoding_mode" value { string_value: "medusa" } }\n')
    facts = json.loads(CliRunner().invoke(cli, ["inspect", str(tmp_path / "repo"), "--json"]).stdout)
    assert facts == {"flavour": "trtllm", "engine": "/engines/vicuna", "decoding_mode": "medusa",
                     "models": {"tensorrt_llm": "tensorrtllm, max_batch_size 4, decoupled, 1 instance(s)"}}
