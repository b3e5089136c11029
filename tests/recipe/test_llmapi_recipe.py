"""Recipes of deploy.flavour llmapi: validated (no convert / build / drafter section, the llmapi fields only with
it), turned into the exact `trtspec deploy --flavour llmapi` command and doctor, run (deploy, then serve / bench
skipped, saying why) on a tiny base and EAGLE-3 draft written here, and the shipped GPU recipe's command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.recipe import RunOptions, command_lines, dry_run_lines, load_recipe, recipe_from_dict, run_recipe
from trtspec.testing.factory import TinyModel, write_eagle3_draft, write_hf_base

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
MODEL = TinyModel(num_layers=8)
BASE = {"name": "r", "base": {"path": "models/base"}}
LLMAPI = {**BASE, "deploy": {"flavour": "llmapi", "drafter": "eagle3", "draft_path": "models/eagle3"}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A recipe folder: the tiny base and draft beside it, the recipe naming them relative to its file."""
    root = tmp_path_factory.mktemp("llmapi-recipe")
    write_hf_base(root / "models" / "base", MODEL)
    write_eagle3_draft(root / "models" / "eagle3", MODEL, draft_vocab_size=128)
    recipe = {"name": "tiny-eagle3-llmapi", "base": {"path": "models/base"},
              "deploy": {"flavour": "llmapi", "drafter": "eagle3", "draft_path": "models/eagle3",
                         "trtllm_version": "1.4", "max_draft_len": 3, "max_batch_size": 8,
                         "speculative_options": ["max_concurrency=4"]},
              "serve": {}, "bench": {}}
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    return root


def test_the_exact_deploy_command(folder):
    recipe = load_recipe(folder / "recipe.yaml")
    assert recipe.stages == ("deploy", "serve", "bench")
    lines = command_lines(recipe, "w")
    base, draft = folder / "models" / "base", folder / "models" / "eagle3"
    assert lines == [f"trtspec deploy --flavour llmapi --hf {base} --out w/tiny-eagle3-llmapi/triton_repo --eagle3 "
                     f"{draft} --trtllm-version 1.4 --max-draft-len 3 --speculative-option max_concurrency=4 "
                     "--max-batch-size 8",
                     "trtspec doctor w/tiny-eagle3-llmapi/triton_repo"]
    # every flag is deploy's own: the command parses
    result = CliRunner().invoke(cli, [*shlex.split(lines[0])[1:], "--help"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("drafter,flags", [
    ({"drafter": "mtp", "max_draft_len": 2}, "--mtp --max-draft-len 2"),
    ({"drafter": "ngram"}, "--ngram"),
    ({"drafter": "ngram", "max_draft_len": 3, "draft_len_schedule": {8: 0, 1: 3, 4: 1}},
     "--ngram --max-draft-len 3 --draft-len-schedule 1:3,4:1,8:0"),
    ({"drafter": "draft_target", "draft_path": "models/draft"}, "--draft-model models/draft"),
    ({}, ""),
    ({"drafter": "ngram", "decoupled": False, "kv_cache_free_gpu_mem_fraction": 0.8, "max_num_tokens": 4096},
     "--ngram --max-num-tokens 4096 --no-decoupled --kv-cache-free-gpu-mem-fraction 0.8"),
])
def test_each_drafter_kind(drafter, flags):
    recipe = recipe_from_dict({**BASE, "deploy": {"flavour": "llmapi", **drafter}})
    line = command_lines(recipe, "w")[0]
    assert line == f"trtspec deploy --flavour llmapi --hf models/base --out w/r/triton_repo {flags}".rstrip()


@pytest.mark.parametrize("data,message", [
    ({**LLMAPI, "base": {"fetch": "smollm2-135m"}}, "deploy.flavour llmapi needs base.path"),
    ({**LLMAPI, "drafter": {"kind": "medusa", "path": "h"}}, "recipe drafter: deploy.flavour llmapi has no drafter "
                                                            "stage (name it with deploy.drafter"),
    ({**LLMAPI, "build": {"backend": "trtllm"}}, "recipe build: deploy.flavour llmapi has no build stage"),
    ({**LLMAPI, "convert": {"dtype": "float16"}}, "has no convert stage"),
    ({**LLMAPI, "baseline": {}}, "recipe baseline: the gate measures an engine"),
    ({**BASE, "deploy": {"flavour": "llmapi", "drafter": "eagle"}}, "deploy.drafter 'eagle' is not one of eagle3, "
                                                                    "mtp, ngram, draft_target"),
    ({**BASE, "deploy": {"flavour": "llmapi", "drafter": "eagle3"}}, "deploy.drafter eagle3 needs deploy.draft_path"),
    ({**BASE, "deploy": {"flavour": "llmapi", "drafter": "ngram", "draft_len_schedule": [1, 3]}},
     "deploy.draft_len_schedule must map batch sizes to draft lengths"),
    ({**BASE, "deploy": {"flavour": "llmapi", "draft_len_schedule": {1: 3}}}, "need a deploy.drafter"),
    ({**BASE, "deploy": {"draft_len_schedule": {1: 3}}}, "deploy.draft_len_schedule applies to deploy.flavour llmapi"),
    ({**BASE, "deploy": {"flavour": "llmapi", "drafter": "mtp", "draft_path": "d"}}, "draft_path applies to"),
    ({**BASE, "deploy": {"flavour": "llmapi", "max_draft_len": 3}}, "need a deploy.drafter"),
    ({**BASE, "deploy": {"flavour": "llmapi", "drafter": "ngram", "trtllm_version": "1.2"}},
     "holds the LLM-API keys of"),
    ({**BASE, "deploy": {"flavour": "llmapi", "threads": 4}}, "deploy.threads applies to the engine flavours"),
    ({**BASE, "deploy": {"flavour": "llmapi", "speculative_options": "a=1"}}, "list of KEY=VALUE strings"),
    ({**BASE, "deploy": {"drafter": "eagle3"}}, "deploy.drafter applies to deploy.flavour llmapi"),
    ({**BASE, "deploy": {"flavour": "vllm"}}, "deploy.flavour 'vllm' is not one of cpu, trtllm, llmapi"),
    ({**BASE, "deploy": {"flavour": "llmapi", "max_num_tokens": "many"}}, "deploy.max_num_tokens must be an integer"),
])
def test_llmapi_recipe_errors(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        recipe_from_dict(data)


def test_stages_it_cannot_run(folder):
    recipe = load_recipe(folder / "recipe.yaml")
    lines = dry_run_lines(recipe, Path("w"), recipe.stages)
    assert lines[0] == "# deploy" and lines[3:5] == ["# serve", f"# (skipped: {recipe.skipped('serve')})"]
    assert "GPU host" in recipe.skipped("bench")
    result = CliRunner().invoke(cli, ["recipe", "run", str(folder / "recipe.yaml"), "--stages", "convert"])
    assert result.exit_code != 0 and "the recipe has no convert stage" in result.output


def test_run_deploys_checks_and_skips(folder, tmp_path):
    work = tmp_path / "work"
    shown = []
    report = run_recipe(RunOptions(recipe_file=folder / "recipe.yaml", workdir=work), show=shown.append)
    assert report.passed and [(o.stage, o.status) for o in report.outcomes] == [
        ("deploy", "ran"), ("serve", "skipped"), ("bench", "skipped")]
    assert "serves in the Triton TensorRT-LLM container on a GPU host" in shown[1]
    repo = work / "tiny-eagle3-llmapi" / "triton_repo"
    doc = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert doc["speculative_config"] == {"decoding_type": "Eagle3", "max_draft_len": 3,
                                         "speculative_model": str(folder / "models" / "eagle3"),
                                         "max_concurrency": 4}
    log = (work / "tiny-eagle3-llmapi" / "logs" / "deploy.log").read_text()
    assert "$ trtspec doctor" in log and "no problems found" in log
    # unchanged: skipped; the draft's config changed: deploy runs again
    report = run_recipe(RunOptions(recipe_file=folder / "recipe.yaml", workdir=work, stages=("deploy",)),
                        show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped"]
    config = folder / "models" / "eagle3" / "config.json"
    original = config.read_text()
    try:
        config.write_text(json.dumps({**json.loads(original), "eagle_config": {"norm_before_fc": False}}))
        report = run_recipe(RunOptions(recipe_file=folder / "recipe.yaml", workdir=work, stages=("deploy",)),
                            show=lambda line: None)
        assert [o.status for o in report.outcomes] == ["ran"]
    finally:
        config.write_text(original)


def test_a_mismatched_draft_fails_the_deploy_stage(folder, tmp_path):
    data = yaml.safe_load((folder / "recipe.yaml").read_text())
    write_hf_base(tmp_path / "models" / "wide", TinyModel(hidden_size=128, num_layers=8))
    data["base"]["path"] = "models/wide"
    data["deploy"]["draft_path"] = str(folder / "models" / "eagle3")
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
    report = run_recipe(RunOptions(recipe_file=tmp_path / "recipe.yaml", workdir=tmp_path / "work"),
                        show=lambda line: None)
    assert not report.passed and report.outcomes[0].status == "failed"
    assert "hidden_size 64 differs from the base's hidden_size 128" in report.outcomes[0].detail


def test_the_shipped_gpu_recipe():
    recipe = load_recipe(RECIPES / "llama-3.1-8b-eagle3-llmapi.yaml")
    assert recipe.flavour == "llmapi" and recipe.stages == ("deploy",)
    line = command_lines(recipe, "w")[0]
    assert line.startswith("trtspec deploy --flavour llmapi --hf ") and "--eagle3 " in line
    assert "--trtllm-version 1.4 --max-draft-len 3" in line
    result = CliRunner().invoke(cli, ["recipe", "check", str(RECIPES / "llama-3.1-8b-eagle3-llmapi.yaml")])
    assert result.exit_code == 0, result.output
    printed = result.stdout.splitlines()
    assert printed[0].startswith("trtspec deploy --flavour llmapi --hf ")
    assert printed[0].split(" --hf ")[1].split()[0].endswith("models/Llama-3.1-8B-Instruct")
    assert "models/EAGLE3-LLaMA3.1-Instruct-8B --trtllm-version 1.4" in printed[0]
    assert printed[1] == "trtspec doctor llama-3.1-8b-eagle3-llmapi/triton_repo"
