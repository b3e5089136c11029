"""`recipe run`: stages in order with stamps, a failing stage, corrupt stamps, the gate and its baseline block."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.recipe import load_recipe, recipe_from_dict
from trtspec.recipe.run import RunOptions, dry_run_lines, run_recipe, stamp_path

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
TINY = sorted(RECIPES.glob("tiny-*.yaml"))


def _recipe_file(tmp_path: Path, **changes) -> Path:
    """recipes/tiny-ngram.yaml with sections replaced or updated (a None value drops the section)."""
    path = tmp_path / "recipe.yaml"
    if not changes:  # the file itself, comments and all
        shutil.copy(RECIPES / "tiny-ngram.yaml", path)
        return path
    data = yaml.safe_load((RECIPES / "tiny-ngram.yaml").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The tiny ngram recipe's convert, build and deploy, run once: (work dir, recipe file)."""
    root = tmp_path_factory.mktemp("recipe")
    recipe = _recipe_file(root)
    lines = []
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=root / "work", stages=("convert", "build", "deploy")),
                        show=lines.append)
    assert report.passed, lines
    return root / "work", recipe


def _copy(built, tmp_path) -> tuple[Path, Path]:
    work, recipe = built
    shutil.copytree(work, tmp_path / "work")
    shutil.copy(recipe, tmp_path / "recipe.yaml")
    return tmp_path / "work", tmp_path / "recipe.yaml"


def test_every_shipped_recipe_validates_and_prints_its_commands():
    for path in sorted(RECIPES.glob("*.yaml")):
        recipe = load_recipe(path)
        lines = dry_run_lines(recipe, Path("work"), recipe.stages)
        if recipe.flavour == "llmapi":  # TensorRT-LLM's LLM API loads the Hugging Face base: deploy alone
            assert lines[:2] == ["# deploy", lines[1]] and lines[1].startswith("trtspec deploy --flavour llmapi "), path
            continue
        assert lines[0] == "# convert" and any(line.startswith("trtspec build ") for line in lines), path


def test_a_second_run_skips_what_did_not_change(built, tmp_path):
    work, recipe = _copy(built, tmp_path)
    stages = ("convert", "build", "deploy")
    # the work dir moved: the checkpoint and engine are still current, the repository names the old engine path
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=stages), show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped", "skipped", "ran"]
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=stages), show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped", "skipped", "skipped"]
    # a build setting changed: build and deploy run again, convert stays
    changed = yaml.safe_load(recipe.read_text())
    changed["build"]["profiles"] = "2,9"
    recipe.write_text(yaml.safe_dump(changed, sort_keys=False))
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=("convert", "build", "deploy")),
                        show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped", "ran", "ran"]
    manifest = json.loads((work / "tiny-ngram" / "engine" / "manifest.json").read_text())
    assert manifest["profile"]["slot_profiles"] == [2, 9]
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, force=True, stages=("convert",)),
                        show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["ran"]


def test_an_engine_changed_by_hand_is_deployed_again(built, tmp_path):
    work, recipe = _copy(built, tmp_path)
    manifest = work / "tiny-ngram" / "engine" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"name"', '"name" ', 1))
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=("convert", "build", "deploy")),
                        show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped", "skipped", "ran"]


def test_a_corrupt_stamp_runs_its_stage_again(built, tmp_path):
    work, recipe = _copy(built, tmp_path)
    stamp_path(work / "tiny-ngram", "build").write_text("{not json")
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=("convert", "build", "deploy")),
                        show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["skipped", "ran", "ran"]


def test_a_failing_stage_keeps_earlier_outputs_and_leaves_none_of_its_own(built, tmp_path):
    work, _ = _copy(built, tmp_path)
    recipe = _recipe_file(tmp_path, build={"profiles": "2,99"})  # more slots than K + 1 = 9
    lines = []
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work), show=lines.append)
    assert not report.passed and [o.status for o in report.outcomes] == ["skipped", "failed"]
    failed = report.outcomes[-1].detail
    assert "trtspec build" in failed and "exited 1" in failed and "99" in failed and "Traceback" not in failed
    root = work / "tiny-ngram"
    assert (root / "checkpoint" / "config.json").is_file() and stamp_path(root, "convert").is_file()
    assert not (root / "engine").exists() and not stamp_path(root, "build").exists()
    assert not stamp_path(root, "deploy").exists()
    assert list(root.glob(".*tmp*")) == [] and list(root.glob("*tmp*")) == []


def test_the_gate_passes_on_its_baseline_and_fails_when_broken(built, tmp_path):
    work, recipe = _copy(built, tmp_path)
    result = CliRunner().invoke(cli, ["recipe", "run", str(recipe), "--workdir", str(work), "--stages", "bench",
                                      "--gate", "--update-baseline"])
    assert result.exit_code == 0, result.output
    text = recipe.read_text()
    assert "# relative drop that fails the gate" in text  # comments kept
    figures = load_recipe(recipe).baseline.figures["mt-bench"]
    assert figures["tau"] >= 1.0 and 0 <= figures["acceptance_rate"] <= 1
    gate = json.loads((work / "tiny-ngram" / "bench" / "gate.json").read_text())
    assert gate["passed"] and gate["identical"] == {"mt-bench": "3/3"}
    assert (work / "tiny-ngram" / "bench" / "gate.png").stat().st_size > 1000

    # the same slice again against its own figures: deterministic at T = 0, so τ and acceptance hold exactly
    result = CliRunner().invoke(cli, ["recipe", "run", str(recipe), "--workdir", str(work), "--stages", "bench",
                                      "--gate"])
    assert result.exit_code == 0, result.output
    assert "gate passed" in result.output

    broken = yaml.safe_load(text)
    broken["baseline"]["figures"]["mt-bench"]["tau"] = round(figures["tau"] * 1.2, 3)  # τ fell 17%: past 5%
    recipe.write_text(yaml.safe_dump(broken, sort_keys=False))
    result = CliRunner().invoke(cli, ["recipe", "run", str(recipe), "--workdir", str(work), "--stages", "bench",
                                      "--gate"])
    assert result.exit_code == 1
    assert "gate FAILED: mt-bench: tau" in result.output and "FAIL" in result.output
    assert not json.loads((work / "tiny-ngram" / "bench" / "gate.json").read_text())["passed"]


@pytest.mark.parametrize("baseline,message", [
    ({"tolerance": {"tau": 1.5}}, "baseline.tolerance.tau must be a fraction in [0, 1), got 1.5"),
    ({"tolerance": {"latency": 0.1}}, "baseline.tolerance: unknown figure 'latency'; figures: tau, "),
    ({"tolerance": [0.1]}, "baseline.tolerance must map figures to fractions"),
    ({"figures": {"mt-bench": {"tau": "high"}}}, "baseline.figures.mt-bench.tau must be a number, got 'high'"),
    ({"figures": {"humaneval": {"tau": 2.0}}}, "baseline.figures.humaneval: not one of baseline.prompt_sets"),
    ({"prompt_sets": ["mtbench"]}, "baseline.prompt_sets: unknown prompt set 'mtbench'"),
    ({"limit": "four"}, "baseline.limit must be an integer, got 'four'"),
    ({"tolerances": {}}, "recipe baseline: unknown key 'tolerances'; valid keys: figures, limit, max_tokens, method, "),
    ({"verify_curve": {"profiles": [2, 3], "relative": [1.0, 1.1]}}, "baseline.verify_curve: profiles must be "),
    ({"verify_curve": {"profiles": [1, 2]}}, "baseline.verify_curve must have exactly profiles and relative"),
])
def test_a_malformed_baseline_is_one_line_naming_the_field(tmp_path, baseline, message):
    data = yaml.safe_load((RECIPES / "tiny-ngram.yaml").read_text())
    data["baseline"] = {**data["baseline"], **baseline}
    with pytest.raises(ConfigError) as e:
        recipe_from_dict(data)
    assert message in str(e.value)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    result = CliRunner().invoke(cli, ["recipe", "run", str(path), "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 1 and f"error: {path}: " in result.output and "Traceback" not in result.output
    assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("flags,message", [
    (["--stages", "convert,deploy,publish"], "--stages: unknown stage 'publish'; stages: convert, build, deploy"),
    (["--stages", "build", "--gate"], "--gate judges the bench stage"),
    (["--update-baseline"], "--update-baseline writes what --gate measures"),
])
def test_bad_flags(tmp_path, flags, message):
    result = CliRunner().invoke(cli, ["recipe", "run", str(RECIPES / "tiny-ngram.yaml"), "--workdir",
                                      str(tmp_path / "w"), *flags])
    assert result.exit_code == 1 and message in result.output, result.output
    assert not (tmp_path / "w").exists()


def test_dry_run_prints_every_stage_and_runs_nothing(tmp_path):
    result = CliRunner().invoke(cli, ["recipe", "run", str(RECIPES / "tiny-ngram.yaml"), "--workdir",
                                      str(tmp_path / "w"), "--dry-run"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert [line for line in lines if line.startswith("# ") and " " not in line[2:]] == [
        "# convert", "# build", "# deploy", "# serve", "# bench"]
    assert any(line.startswith("trtspec build ") and "--no-spec --max-draft-len 8" in line for line in lines)
    assert not (tmp_path / "w").exists()


def test_a_gpu_recipe_on_this_machine_stops_at_a_missing_base_with_one_line(tmp_path):
    result = CliRunner().invoke(cli, ["recipe", "run", str(RECIPES / "vicuna-7b-medusa.yaml"), "--workdir",
                                      str(tmp_path / "w")])
    assert result.exit_code == 1
    assert "convert" in result.output and "failed" in result.output and "models/vicuna-7b-v1.3" in result.output


@pytest.mark.slow
def test_a_tiny_recipe_runs_end_to_end_through_its_gate(tmp_path):
    """What .ci/run does for every tiny recipe after the tests: every stage, the real server included, then the gate
    against the shipped baseline."""
    path = RECIPES / "tiny-medusa.yaml"
    lines = []
    report = run_recipe(RunOptions(recipe_file=path, workdir=tmp_path, gate=True), show=lines.append)
    assert report.passed, "\n".join(lines)
    assert [o.stage for o in report.outcomes] == ["convert", "build", "deploy", "serve", "bench"]
    assert report.gate.passed and report.gate.checks
    serve = json.loads((tmp_path / path.stem / "serve" / "report.json").read_text())
    assert serve["identical"] == f"{len(serve['requests'])}/{len(serve['requests'])}"


def test_every_recipe_field_becomes_an_option_the_cli_has():
    """A recipe with every convert / build / deploy field set: each command it stands for names a real command with
    real options (so a renamed flag breaks this test, not a user's recipe run)."""
    import click

    data = {"name": "all", "base": {"path": "hf"},
            "drafter": {"kind": "medusa", "path": "heads", "num_heads": 3, "num_medusa_layers": 1},
            "convert": {"dtype": "float32", "tp_size": 2, "pp_size": 2, "max_draft_len": 8},
            "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128, "max_draft_len": 8,
                      "choices": "[[0],[1]]", "profiles": "2,9", "weights": "int4", "block_size": 64},
            "deploy": {"max_batch_size": 2, "decoupled": False, "instances": 2, "method": "suffix",
                       "datastore": "d.ds", "threads": 1, "spin": False, "chat_template": True, "copy_engine": True},
            "serve": {}, "bench": {"datastore": "d.ds", "threads": 1, "spin": False}}
    recipe = recipe_from_dict(data)
    commands = recipe.stage_commands("w")
    seen = set()
    for stage in ("convert", "build", "deploy", "bench"):
        for argv in commands[stage]:
            command, rest = cli, argv[1:]
            while isinstance(command, click.Group) and rest and rest[0] in command.commands:
                command, rest = command.commands[rest[0]], rest[1:]
            options = {o for p in command.params for o in getattr(p, "opts", []) + getattr(p, "secondary_opts", [])}
            flags = [w for w in rest if w.startswith("--")]
            assert set(flags) <= options, (stage, set(flags) - options)
            seen |= set(flags)
    assert {"--num-medusa-layers", "--profiles", "--weights", "--block-size", "--no-spin", "--chat-template",
            "--copy-engine", "--no-decoupled", "--datastore"} <= seen


def test_a_gpu_recipe_stops_at_the_build_stage_with_the_exact_command(tmp_path):
    """Where tensorrt_llm is missing (here), convert runs and the build stage stops, naming trtllm-build's argv."""
    data = yaml.safe_load((RECIPES / "tiny-medusa.yaml").read_text())
    data.update(name="tiny-gpu", build={"backend": "trtllm", "trtllm_version": "1.2", "max_input_len": 128,
                                        "max_batch_size": 2}, deploy={})
    for key in ("serve", "bench", "baseline"):
        data.pop(key)
    recipe = tmp_path / "gpu.yaml"
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=tmp_path / "w"), show=lambda line: None)
    assert [o.status for o in report.outcomes] == ["ran", "failed"]
    detail = report.outcomes[-1].detail
    assert "tensorrt_llm is not importable here" in detail and "nvcr.io/nvidia/tritonserver:26.04-trtllm" in detail
    assert "the command to run on the GPU host: trtllm-build --checkpoint_dir " in detail
    assert "--speculative_decoding_mode medusa" in detail
    assert not (tmp_path / "w" / "tiny-gpu" / "engine").exists()


def test_a_baseline_curve_that_does_not_fit_the_engine_is_one_line(built, tmp_path):
    work, recipe = _copy(built, tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["baseline"]["verify_curve"] = {"profiles": [1, 2, 17], "relative": [1.0, 1.1, 1.9]}
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    result = CliRunner().invoke(cli, ["recipe", "run", str(recipe), "--workdir", str(work), "--stages", "bench",
                                      "--gate"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "baseline.verify_curve: a verify curve over slot profiles [2, 17] does not fit this engine's [2, 3, 5, 9]" \
        in result.output and "--update-baseline" in result.output


def test_the_bench_stage_runs_trtspec_bench_per_prompt_set(built, tmp_path):
    """Without --gate the bench stage is `trtspec bench run` per prompt set: every method beside plain decoding at
    every concurrency, summary.json / requests.csv / plots per set, outputs identical to plain decoding at T = 0."""
    work, _ = _copy(built, tmp_path)
    recipe = _recipe_file(tmp_path, bench={"concurrency": [1, 2], "limit": 2, "max_tokens": 16})
    lines = []
    report = run_recipe(RunOptions(recipe_file=recipe, workdir=work, stages=("bench",)), show=lines.append)
    assert report.passed, lines
    summary = json.loads((work / "tiny-ngram" / "bench" / "mt-bench" / "summary.json").read_text())
    assert (work / "tiny-ngram" / "bench" / "mt-bench" / "requests.csv").is_file()
    text = json.dumps(summary)
    assert '"ngram"' in text and "identical" in text
    assert any("ngram" in line for line in lines)


def test_paths_are_relative_to_the_recipe_file_and_check_names_the_missing(tmp_path, monkeypatch):
    """base.path, drafter.path and the datastores resolve against the recipe's folder, whatever the working folder;
    absolute paths stay; `recipe check` prints the commands and, on stderr, each path that does not exist."""
    folder = tmp_path / "recipes"
    (folder / "heads").mkdir(parents=True)
    (tmp_path / "models" / "base").mkdir(parents=True)
    store = tmp_path / "corpus.ds"
    store.write_bytes(b"")
    data = {"name": "r", "base": {"path": "../models/base"}, "drafter": {"kind": "medusa", "path": "heads"},
            "deploy": {"method": "suffix", "datastore": str(store)}, "bench": {"datastore": "missing.ds"}}
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    recipe = load_recipe(Path("../recipes/r.yaml"))
    assert (recipe.base.path, recipe.drafter.path) == ("../models/base", "../recipes/heads")
    assert recipe.deploy.datastore == str(store) and recipe.bench.datastore == "../recipes/missing.ds"
    result = CliRunner().invoke(cli, ["recipe", "check", "../recipes/r.yaml"])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith("trtspec convert --base ../models/base --out r/checkpoint "
                                                    "--medusa ../recipes/heads")
    assert result.stderr.splitlines() == ["warning: bench.datastore missing.ds does not exist (../recipes/missing.ds: "
                                          "paths in a recipe are relative to its file)"]


def test_the_shipped_recipes_find_their_assets_from_anywhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    recipe = load_recipe(RECIPES / "smollm2-135m-eagle.yaml")
    assert Path(recipe.drafter.path) == RECIPES / "assets" / "smollm2-135m-eagle" and Path(recipe.drafter.path).is_dir()
    result = CliRunner().invoke(cli, ["recipe", "check", str(RECIPES / "smollm2-135m-medusa.yaml")])
    assert result.exit_code == 0 and result.stderr == "", result.output


def test_a_template_written_elsewhere_keeps_naming_the_same_folders(tmp_path):
    from trtspec.recipe.tuned import rebase_paths

    recipe = {"base": {"path": "../models/base"}, "drafter": {"kind": "medusa", "path": "/abs/heads"},
              "deploy": {"datastore": "c.ds"}}
    rebase_paths(recipe, tmp_path / "recipes", tmp_path / "out" / "deep")
    assert recipe == {"base": {"path": "../../models/base"}, "drafter": {"kind": "medusa", "path": "/abs/heads"},
                      "deploy": {"datastore": "../../recipes/c.ds"}}


def test_a_trtllm_recipe_is_rehearsed_in_the_real_server(tmp_path):
    """`recipe run --rehearse` on the shipped tiny TensorRT-LLM recipe: the engine planned, a CPU engine built beside
    it, the GPU repository deployed with it standing in and served for real, every reply the CPU engine's text; the
    bench stage left to the GPU host; an onnx recipe is refused in one line."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "recipes"
    dry = CliRunner().invoke(cli, ["recipe", "run", str(root / "rehearsal-tiny-medusa.yaml"), "--rehearse",
                                   "--dry-run", "--workdir", str(tmp_path)])
    assert dry.exit_code == 0, dry.output
    assert "--backend trtllm" in dry.output and "--plan-only" in dry.output and "--rehearse" in dry.output
    report = run_recipe(RunOptions(recipe_file=root / "rehearsal-tiny-medusa.yaml", workdir=tmp_path, rehearse=True),
                        show=lambda line: None)
    assert report.passed, [(o.stage, o.detail) for o in report.outcomes]
    assert [o.stage for o in report.outcomes] == ["convert", "build", "deploy", "serve"]
    assert "2 replies through the ensemble, all the CPU engine's greedy text" in report.outcomes[-1].detail
    assert (tmp_path / "rehearsal-tiny-medusa" / "cpu-engine" / "manifest.json").is_file()
    refused = CliRunner().invoke(cli, ["recipe", "run", str(root / "tiny-ngram.yaml"), "--rehearse", "--dry-run"])
    assert refused.exit_code != 0
    assert refused.output.strip() == ("error: --rehearse runs a trtllm recipe's GPU repository here; tiny-ngram builds "
                                      "for onnx (run it without --rehearse)")


def test_a_draft_target_recipe_is_rehearsed_through_the_bls_loop(tmp_path):
    """A draft-target trtllm recipe rehearsed: both TensorRT-LLM engines planned, a CPU engine for each, the GPU
    repository served with both standing in, every reply of the BLS's draft-target loop the target's greedy text."""
    import yaml

    from trtspec.testing.factory import TinyModel, write_hf_base
    from trtspec.testing.tokenizers import write_tiny_tokenizer

    bases = {}
    for name, fields, seed in (("target", {}, 0), ("draft", {"num_layers": 1}, 5)):
        bases[name] = tmp_path / name
        vocab = write_tiny_tokenizer(bases[name])
        write_hf_base(bases[name], TinyModel(vocab_size=vocab, max_position_embeddings=4096, **fields), seed=seed)
    recipe = {"name": "pair", "base": {"path": str(bases["target"])},
              "drafter": {"kind": "draft_target", "path": str(bases["draft"])},
              "build": {"backend": "trtllm", "max_draft_len": 4, "max_input_len": 1024, "max_batch_size": 4},
              "serve": {"prompt_set": "mt-bench", "limit": 2, "max_tokens": 24}}
    (tmp_path / "pair.yaml").write_text(yaml.safe_dump(recipe))
    report = run_recipe(RunOptions(recipe_file=tmp_path / "pair.yaml", workdir=tmp_path / "w", rehearse=True),
                        show=lambda line: None)
    assert report.passed, [(o.stage, o.detail) for o in report.outcomes]
    assert ("2 replies through tensorrt_llm_bls's draft-target loop (4 draft tokens a step), all the CPU engine's "
            "greedy text") in report.outcomes[-1].detail
    for engine in ("engine", "draft-engine", "cpu-engine", "cpu-draft-engine"):
        assert (tmp_path / "w" / "pair" / engine / "manifest.json").is_file(), engine
