"""The GPU recipes validate, and the build command each one prints plans cleanly against a checkpoint with the
model's published shape (config-only: planning reads config.json)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.recipe import Drafter, command_lines, load_recipe, recipe_from_dict

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GPU = {  # recipe → (config-only checkpoint, K, engine max_seq_len)
    "vicuna-7b-medusa": ("vicuna-7b-medusa", 63, 2048 + 63),
    "vicuna-7b-eagle": ("vicuna-7b-eagle", 63, 2048 + 63 + 4),
    "llama-3.1-8b-lookahead": ("llama-3.1-8b", 83, 4096 + 83),
}


@pytest.mark.parametrize("name", GPU)
def test_gpu_recipe_builds_plan(checkpoints, tmp_path, name):
    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert recipe.name == name and recipe.build.backend == "trtllm"
    lines = command_lines(recipe, str(tmp_path))
    assert [line.split()[1] for line in lines] == ["convert", "build", "deploy", "doctor"]
    build = shlex.split(lines[1])[2:]
    build[0] = str(checkpoints[GPU[name][0]])  # the converted checkpoint, stood in for by its config.json
    result = CliRunner().invoke(cli, ["build", *build, "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert (plan["build_config"]["max_draft_len"], plan["build_config"]["max_seq_len"]) == GPU[name][1:]
    assert plan["container"] == "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"


def test_recipe_check_cli():
    result = CliRunner().invoke(cli, ["recipe", "check", str(RECIPES / "llama-3.1-8b-lookahead.yaml")])
    assert result.exit_code == 0 and "--lookahead 7,7,7" in result.stdout.splitlines()[1]


BASE = {"name": "r", "base": {"path": "models/base"}}


@pytest.mark.parametrize("data,message", [
    ({**BASE, "drafter": {"kind": "medusa"}}, "drafter.kind medusa needs drafter.path"),
    ({**BASE, "drafter": {"kind": "lookahead", "window_size": 7}}, "needs window_size, ngram_size"),
    ({**BASE, "drafter": {"kind": "lookahead", "window_size": 7, "ngram_size": 7, "verification_set_size": 7}},
     "drafter.kind lookahead needs build.backend trtllm"),
    ({**BASE, "drafter": {"kind": "draft_target", "path": "d"}, "build": {"backend": "trtllm"}},
     "draft_target needs build.max_draft_len"),
    ({**BASE, "drafter": {"kind": "ngram"}}, "drafter.kind 'ngram' is not one of"),
    ({**BASE, "build": {"backend": "trtllm", "trtllm_version": "0.9"}}, "outside the TensorRT-LLM engine flow"),
    ({**BASE, "build": {"backend": "onnx"}, "deploy": {"flavour": "trtllm"}}, "does not serve build.backend onnx"),
    ({**BASE, "build": {"max_batch_size": "four"}}, "build.max_batch_size must be an integer"),
    ({**BASE, "build": {"preset": "mc_sim_7b_64"}}, "unknown tree preset"),
    ({**BASE, "bulid": {}}, "unknown key 'bulid'; valid keys: base, baseline, bench, build, convert, deploy, drafter, name, serve"),
    ({"name": "r"}, "needs a base section"),
    (["name", "r"], "recipe: expected a mapping, found list"),
    ({**BASE, "build": 3}, "recipe build: expected a mapping, found int"),
])
def test_recipe_errors(data, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        recipe_from_dict(data)


def test_draft_target_recipe_builds_both_engines():
    recipe = recipe_from_dict({**BASE, "drafter": {"kind": "draft_target", "path": "models/draft"},
                               "build": {"backend": "trtllm", "max_draft_len": 10}})
    assert recipe.drafter.kind is Drafter.DRAFT_TARGET
    lines = command_lines(recipe, "w")
    assert lines[1].startswith("trtspec convert --base models/draft --out w/r/draft-checkpoint")
    assert lines[2].startswith("trtspec build w/r/draft-checkpoint") and "--draft-target" not in lines[2]
    assert "--draft-target --max-draft-len 10" in lines[3]
    assert lines[4].endswith("--draft-engine w/r/draft-engine")


def test_a_redrafter_recipe_converts_its_beams_and_builds_either_backend():
    drafter = {"kind": "redrafter", "path": "models/redrafter", "num_beams": 3, "draft_len_per_beam": 4}
    for backend in ("onnx", "trtllm"):
        recipe = recipe_from_dict({**BASE, "drafter": drafter, "build": {"backend": backend}})
        lines = command_lines(recipe, "w")
        assert lines[0].startswith("trtspec convert --base ") and ("--redrafter models/redrafter "
                                                                   "--redrafter-num-beams 3 "
                                                                   "--redrafter-draft-len-per-beam 4") in lines[0]
        assert lines[1].startswith("trtspec build w/r/checkpoint") and "--choices" not in lines[1]
    for data, message in (({**drafter, "num_beams": 0}, "drafter.num_beams must be a positive integer, got 0"),
                          ({"kind": "medusa", "path": "h", "num_beams": 2}, "num_beams / draft_len_per_beam apply to "
                                                                            "redrafter, not medusa"),
                          ({"kind": "redrafter"}, "drafter.kind redrafter needs drafter.path")):
        with pytest.raises(ConfigError, match=re.escape(message)):
            recipe_from_dict({**BASE, "drafter": data})
