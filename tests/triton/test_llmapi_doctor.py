"""The llmapi flavour's checks outside deploy: `inspect` of an EAGLE-3 draft and an MTP base (with `--base`, the
drafter checks one line per mismatch), the EAGLE-3 capture layers, and `doctor` on an llmapi repository (the recorded
version's keys, the folders where they are local, the drafter against the base)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.checkpoint.llmapi_fields import default_capture, eagle3_layer_ids, mtp_field
from trtspec.cli import cli
from trtspec.testing.factory import TinyModel, write_eagle3_draft, write_hf_base
from trtspec.triton.deploy_options import LlmapiOptions
from trtspec.triton.doctor import doctor
from trtspec.triton.llmapi_check import check_drafter, eagle3_capture
from trtspec.triton.llmapi_repo import deploy_llmapi

MODEL = TinyModel(num_layers=8)  # more than 5 layers: TensorRT-LLM's default capture is 1, 3, 4


def _edit_config(folder: Path, **fields) -> Path:
    config = json.loads((folder / "config.json").read_text())
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llmapi-doctor")
    base = write_hf_base(root / "base", MODEL)
    mtp_base = _edit_config(write_hf_base(root / "mtp-base", MODEL), num_nextn_predict_layers=1)
    eagle3 = write_eagle3_draft(root / "eagle3", MODEL, draft_vocab_size=128)
    named = _edit_config(write_eagle3_draft(root / "named", MODEL, draft_vocab_size=128),
                         eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 4], "norm_before_fc": True})
    return {"base": base, "mtp-base": mtp_base, "eagle3": eagle3, "named": named, "root": root}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


# ---- the fields -------------------------------------------------------------------------------------------------

def test_fields_as_the_loaders_read_them():
    assert mtp_field({"num_nextn_predict_layers": 1}) == ("num_nextn_predict_layers", 1)
    assert mtp_field({"mtp_num_hidden_layers": 2}) == ("mtp_num_hidden_layers", 2)
    assert mtp_field({"num_nextn_predict_layers": 0}) == (None, 0)
    assert eagle3_layer_ids({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2]}}) == \
        ("eagle_config.eagle_aux_hidden_state_layer_ids", [1, 2])
    assert eagle3_layer_ids({"eagle_aux_hidden_state_layer_ids": [2, 16, 29]})[1] == [2, 16, 29]
    assert eagle3_layer_ids({}) == (None, None)
    assert default_capture(32) == (1, 15, 28) and default_capture(5) is None


@pytest.mark.parametrize("ids,written,severity,text", [
    (None, None, "note", "names none"),
    ([1, 3, 4], None, "note", "the ones the draft's"),
    ([2, 4, 5], None, "note", "counted as vLLM counts them"),
    ([0, 2, 7], None, "warning", "eagle3_layers_to_capture=[0, 2, 7]"),
    ([0, 2, 7], [0, 2, 7], "note", "speculative_config.eagle3_layers_to_capture"),
    ([1, 3, 4], [1, 2, 3], "warning", "but the draft's"),
])
def test_eagle3_capture(ids, written, severity, text):
    draft = {} if ids is None else {"eagle_aux_hidden_state_layer_ids": ids}
    got = eagle3_capture({"num_hidden_layers": 8}, draft, written)
    assert got[0] == severity and text in got[1], got


def test_a_small_base_has_no_default_capture():
    severity, line = eagle3_capture({"num_hidden_layers": 2}, {})
    assert severity == "warning" and "no default EAGLE-3 capture" in line


def test_layer_ids_outside_the_base_are_a_mismatch(folders, tmp_path):
    draft = _edit_config(write_eagle3_draft(tmp_path / "d", MODEL, draft_vocab_size=128),
                         eagle_aux_hidden_state_layer_ids=[1, 4, 30])
    lines = check_drafter(folders["base"], "eagle3", draft)
    assert len(lines) == 1 and "names layer 30, but the base has 8 layers" in lines[0]


# ---- inspect ----------------------------------------------------------------------------------------------------

def test_inspect_an_eagle3_draft(folders):
    result = run("inspect", folders["named"], "--json")
    assert result.exit_code == 0, result.output
    details = json.loads(result.stdout)["details"]
    assert details["architectures"] == "LlamaForCausalLMEagle3"
    assert (details["hidden_size"], details["draft_vocab_size"], details["vocab_maps"]) == (64, 128, "d2t, t2d")
    assert details["target_layers"] == "[1, 3, 4] (eagle_config.eagle_aux_hidden_state_layer_ids)"
    assert details["eagle_config"] == {"norm_before_fc": True}
    assert "deploy --flavour llmapi --eagle3" in details["serve"]
    plain = json.loads(run("inspect", folders["eagle3"], "--json").stdout)["details"]
    assert plain["target_layers"].startswith("not named") and "eagle_config" not in plain


def test_inspect_an_eagle3_draft_against_its_base(folders):
    result = run("inspect", folders["named"], "--base", folders["base"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any(line.split()[:2] == ["mismatches", "none"] for line in lines)
    assert any(line.split()[0] == "eagle3_layers" and "the ones the draft's" in line for line in lines)


def test_inspect_against_a_mismatched_base_lists_each_and_exits_1(folders, tmp_path):
    wide = write_hf_base(tmp_path / "wide", TinyModel(hidden_size=128, vocab_size=300, num_layers=8))
    result = run("inspect", folders["eagle3"], "--base", wide)
    assert result.exit_code == 1
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.split()[:1] == ["mismatches"])
    assert "hidden_size 64 differs" in lines[first] and "vocab_size 256 differs" in lines[first + 1]
    result = run("inspect", folders["eagle3"], "--base", wide, "--json")
    assert result.exit_code == 1 and len(json.loads(result.stdout)["details"]["mismatches"]) == 2


def test_inspect_a_draft_model_against_its_base(folders, tmp_path):
    other = write_hf_base(tmp_path / "other", TinyModel(vocab_size=300))
    result = run("inspect", other, "--base", folders["base"])
    assert result.exit_code == 1 and "vocab_size 300 differs" in result.stdout


def test_inspect_base_refused_for_other_drafters(folders, tmp_path):
    from trtspec.testing.factory import write_medusa_heads

    heads = write_medusa_heads(tmp_path / "heads", MODEL)
    result = run("inspect", heads, "--base", folders["base"])
    assert result.exit_code != 0 and "--base checks an EAGLE-3 draft or a draft model" in result.output


def test_inspect_an_mtp_base(folders, tmp_path):
    details = json.loads(run("inspect", folders["mtp-base"], "--json").stdout)["details"]
    assert details["mtp_layers"].startswith("1 (num_nextn_predict_layers)")
    assert "mtp_layers" not in json.loads(run("inspect", folders["base"], "--json").stdout)["details"]
    # an architecture trtspec does not convert: its config.json alone
    deepseek = _edit_config(write_hf_base(tmp_path / "ds", MODEL), architectures=["DeepseekV3ForCausalLM"],
                            model_type="deepseek_v3", num_nextn_predict_layers=1)
    result = run("inspect", deepseek, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["architecture"] == "DeepseekV3ForCausalLM" and "--mtp" in summary["details"]["mtp_layers"]


# ---- doctor -----------------------------------------------------------------------------------------------------

def _deploy(folders, tmp_path, drafter=None, draft=None, **kwargs) -> Path:
    base = folders["mtp-base"] if drafter == "mtp" else folders["base"]
    return deploy_llmapi(LlmapiOptions(hf_dir=base, out=tmp_path / "repo", drafter=drafter, draft_dir=draft, **kwargs))


def _yaml_path(repo: Path) -> Path:
    return repo / "tensorrt_llm" / "1" / "model.yaml"


def _rewrite(repo: Path, edit) -> None:
    """model.yaml edited as a person would (the header comments kept)."""
    path = _yaml_path(repo)
    text = path.read_text()
    head = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    doc = yaml.safe_load(text)
    edit(doc)
    path.write_text(head + yaml.safe_dump(doc, sort_keys=False))


def test_deploy_records_the_version_and_the_model_ignores_it(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "eagle3", folders["named"], trtllm_version="1.3")
    text = _yaml_path(repo).read_text()
    assert "# trtspec llmapi version: 1.3 " in text
    assert "trtspec" not in yaml.safe_load(text)  # a comment: no key reaches LLM(**args)


@pytest.mark.parametrize("drafter,draft", [(None, None), ("eagle3", "named"), ("mtp", None), ("ngram", None)])
def test_doctor_passes_what_deploy_wrote(folders, tmp_path, drafter, draft):
    repo = _deploy(folders, tmp_path, drafter, folders[draft] if draft else None)
    checked = []
    findings = doctor(repo, checked=checked)
    assert [f for f in findings if f.severity != "note"] == [], findings
    what = {c.what for c in checked}
    assert {"version", "triton_config", "keys", "model"} <= what
    if drafter is not None:
        assert "drafter" in what
    result = run("doctor", repo)
    assert result.exit_code == 0 and result.stdout.rstrip().endswith("no problems found"), result.output
    assert "checked: tensorrt_llm: version: TensorRT-LLM 1.4 (recorded in model.yaml" in result.stdout


def test_doctor_finds_each_problem_on_one_line(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "eagle3", folders["named"])

    def edit(doc):
        doc["speculative_config"]["speculative_model_dir"] = doc["speculative_config"].pop("speculative_model")
        doc["speculative_config"]["eagle3_one_model"] = True
        doc["enable_chunked_prefill"] = True
        doc["kv_cache_config"]["dtype"] = "fp8"
        del doc["triton_config"]["decoupled"]

    _rewrite(repo, edit)
    findings = doctor(repo)
    by_field = {f.field: f for f in findings}
    assert by_field["speculative_config.speculative_model_dir"].severity == "error"
    assert "this version calls it speculative_model" in by_field["speculative_config.speculative_model_dir"].message
    assert by_field["speculative_config.eagle3_one_model"].severity == "error"
    assert by_field["speculative_config.speculative_model"].severity == "error"  # Eagle3 without its folder
    assert by_field["enable_chunked_prefill"].severity == "warning"
    assert by_field["kv_cache_config.dtype"].severity == "warning"
    assert by_field["triton_config.decoupled"].severity == "error"
    result = run("doctor", repo)
    assert result.exit_code == 1
    assert all("\n" not in str(f) for f in findings)


def test_doctor_checks_the_version_recorded(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "ngram")
    path = _yaml_path(repo)
    path.write_text(path.read_text().replace("version: 1.4 ", "version: 1.3 "))
    findings = doctor(repo)
    assert [f.field for f in findings if f.severity == "error"] == ["speculative_config.decoding_type"]
    assert "'NGram' is not a decoding type trtspec holds for TensorRT-LLM 1.3" in str(findings[0])
    # no version recorded: the newest held, with a warning
    path.write_text("\n".join(line for line in path.read_text().splitlines() if not line.startswith("#")))
    findings = doctor(repo)
    assert [(f.severity, f.field) for f in findings] == [("warning", "model.yaml")]
    assert "records no TensorRT-LLM version" in findings[0].message


def test_doctor_warns_for_the_gpu_hosts_paths(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "eagle3", folders["eagle3"], model_path="/models/Llama-3.1-8B-Instruct",
                   draft_path="/models/EAGLE3-LLaMA3.1-Instruct-8B")
    checked = []
    findings = doctor(repo, checked=checked)
    assert [(f.severity, f.field) for f in findings] == [("warning", "model"),
                                                         ("warning", "speculative_config.speculative_model")]
    assert "not on this machine" in findings[0].message and "drafter" not in {c.what for c in checked}


def test_doctor_checks_the_drafter_against_the_base(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "eagle3", folders["eagle3"])
    wide = write_hf_base(tmp_path / "wide", TinyModel(hidden_size=128, vocab_size=300, num_layers=8))
    _rewrite(repo, lambda doc: doc.update(model=str(wide)))
    errors = [f for f in doctor(repo) if f.severity == "error"]
    assert len(errors) == 2 and "hidden_size" in errors[0].message and "vocab_size" in errors[1].message
    # the layers TensorRT-LLM captures against the ones the draft names
    repo = _deploy(folders, tmp_path / "b", "eagle3", folders["named"],
                   speculative_options=("eagle3_layers_to_capture=[2, 5, 6]",))
    findings = doctor(repo)
    assert [(f.severity, f.field) for f in findings] == [("warning", "speculative_config.eagle3_layers_to_capture")]


def test_doctor_on_an_mtp_base_that_lost_its_layers(folders, tmp_path):
    repo = _deploy(folders, tmp_path, "mtp", max_draft_len=3)
    findings = doctor(repo)
    assert [(f.severity, f.field) for f in findings] == [("note", "speculative_config.num_nextn_predict_layers")]
    _rewrite(repo, lambda doc: doc.update(model=str(folders["base"])))
    errors = [f for f in doctor(repo) if f.severity == "error"]
    assert len(errors) == 1 and "num_nextn_predict_layers" in errors[0].message
