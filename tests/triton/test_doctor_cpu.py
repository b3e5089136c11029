"""`trtspec doctor` on trtspec's CPU flavour: no false finding on anything `deploy` writes, and its own checks."""

from __future__ import annotations

import json
import os
import re
import shutil

import pytest

from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.doctor import doctor

DEPLOYS = {
    "default": {},
    "none": {"method": "none"},
    "ngram": {"method": "ngram"},
    "lookahead": {"method": "lookahead"},
    "hybrid": {"method": "hybrid"},
    "unary": {"decoupled": False},
    "chat-template": {"chat_template": True},
    "copied": {"copy_engine": True},
    "spin-threads": {"spin": True, "threads": 1},
}


@pytest.fixture(scope="module")
def store(tiny_engine, tmp_path_factory):
    from trtspec.speculative.datastore import Datastore

    path = tmp_path_factory.mktemp("store") / "corpus.ds"
    Datastore.from_documents([[1, 2, 3, 4]], vocab_size=20).save(path)
    return path


@pytest.mark.parametrize("name", [*DEPLOYS, "suffix"])
def test_no_finding_on_any_cpu_repository_deploy_writes(tiny_engine, tmp_path, name, store):
    options = DEPLOYS.get(name, {"method": "suffix", "datastore": store})
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo", **options))
    assert _problems(doctor(repo, tiny_engine)) == []
    assert _problems(doctor(repo)) == []


def _set_param(repo, key, value):
    config = repo / "tensorrt_llm" / "config.pbtxt"
    text = config.read_text()
    pattern = rf'(key: "{key}"\s*value: \{{ string_value: ")[^"]*(")'
    assert re.search(pattern, text), key
    config.write_text(re.sub(pattern, rf"\g<1>{value}\g<2>", text))


def test_the_cpu_flavours_own_checks(tiny_engine, tmp_path):
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo", copy_engine=True))
    engine = repo / "tensorrt_llm" / "1" / "engine"
    assert engine.is_dir() and _problems(doctor(repo, tiny_engine)) == []  # a copy of the ENGINE given
    other = tmp_path / "other"
    shutil.copytree(tiny_engine, other)
    manifest = json.loads((other / "manifest.json").read_text())
    (other / "manifest.json").write_text(json.dumps({**manifest, "name": "another"}))
    findings = {(f.severity, f.field): f.message for f in _problems(doctor(repo, other))}
    assert findings == {("warning", "engine_dir"): f"loads {engine.resolve()}, not the ENGINE given ({other})"}

    _set_param(repo, "method", "eagle")  # a Medusa engine
    [finding] = _problems(doctor(repo))
    assert (finding.severity, finding.field) == ("error", "method")
    assert finding.message.startswith("'eagle' does not run on ") and "(it runs none, medusa, " in finding.message

    _set_param(repo, "method", "suffix")
    _set_param(repo, "datastore", "missing.ds")
    assert [(f.severity, f.field, f.message) for f in _problems(doctor(repo))] == [
        ("error", "datastore", "missing.ds does not exist; the model fails to load")]

    _set_param(repo, "datastore", "")
    _set_param(repo, "threads", str((os.cpu_count() or 1) + 1))
    [finding] = _problems(doctor(repo))
    assert (finding.severity, finding.field) == ("warning", "threads")

    _set_param(repo, "threads", "0")
    weights = engine / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the same size, another content: only the hashes tell (as `trtspec serve` checks them)
    weights.write_bytes(bytes(data))
    [finding] = _problems(doctor(repo))
    assert (finding.severity, finding.field) == ("error", "engine_dir")
    assert "content hash" in finding.message and finding.message.endswith("`trtspec serve` refuses the repository")
    weights.write_bytes(weights.read_bytes()[:100])
    [finding] = _problems(doctor(repo))
    assert (finding.severity, finding.field) == ("error", "engine_dir")
    assert "100 bytes, the manifest says" in finding.message and finding.message.endswith("the model fails to load")
    shutil.rmtree(engine)
    [finding] = _problems(doctor(repo))
    assert (finding.severity, finding.field) == ("error", "engine_dir")


def _problems(findings):
    """The errors and warnings (a note is a fact, e.g. which request tensor names the ensemble takes)."""
    return [f for f in findings if f.severity != "note"]


def test_an_engine_running_tree_attention_needs_the_native_library(tiny_engine, tmp_path, monkeypatch):
    """A repository whose engine runs TreeAttention on a machine where trtspec's ops are not built: doctor says the
    model fails to load and names the setup script."""
    from trtspec import native
    from trtspec.engine.manifest import read_manifest

    assert read_manifest(tiny_engine).attention == "tree"
    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo"))
    assert _problems(doctor(repo)) == []
    monkeypatch.setattr(native, "LIBRARY", tmp_path / "missing" / "libtrtspec_ops.so")
    problems = _problems(doctor(repo))
    assert len(problems) == 1 and "TreeAttention" in str(problems[0]) and "scripts/setup.sh" in str(problems[0]), problems


def test_the_cli_lists_what_it_checked_on_a_cpu_repository(tiny_engine, tmp_path):
    """`trtspec doctor` on a CPU repository names each thing it checked (engine, hashes, compiled ops, method,
    threads) before "no problems found"; --json carries them; --help says it checks both flavours."""
    from click.testing import CliRunner

    from trtspec.cli import cli

    repo = deploy(DeployOptions(engine_dir=tiny_engine, out=tmp_path / "repo", method="ngram"))
    result = CliRunner().invoke(cli, ["doctor", str(repo)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    checked = {line.split(": ")[2]: line for line in lines if line.startswith("checked: tensorrt_llm: ")}
    assert list(checked) == ["engine", "hashes", "compiled ops", "method", "threads"], lines
    assert str(tiny_engine) in checked["engine"] and "files as built (blake2b" in checked["hashes"]
    assert "TreeAttention and PromptAttention from " in checked["compiled ops"]
    assert "ngram runs on the engine" in checked["method"]
    assert checked["threads"].endswith("all cores per instance, 1 instance(s), " f"{os.cpu_count()} cores")
    assert lines[-1] == f"{repo}: no problems found"
    as_json = json.loads(CliRunner().invoke(cli, ["doctor", str(repo), "--json"]).stdout)
    assert [c["what"] for c in as_json["checked"]] == list(checked) and as_json["errors"] == 0
    help_text = " ".join(CliRunner().invoke(cli, ["doctor", "--help"]).stdout.split())
    assert help_text.startswith("Usage: cli doctor [OPTIONS] REPOSITORY [ENGINE] Check a TensorRT-LLM or CPU "
                                "Triton repository and its engine. TensorRT-LLM: ")
    listing = CliRunner().invoke(cli, ["--help"]).stdout
    assert "doctor     Check a TensorRT-LLM or CPU Triton repository and its engine.\n" in listing
