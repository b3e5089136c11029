"""The GPU path prepared before the GPU (issue 37): a small Medusa checkpoint plans with a default tree that fits
it, K follows the tree, the plan says what a padded K or a float32 checkpoint costs (each note once), every hint
names a flag its command has, and `build --plan-only` writes an engine folder that `deploy` turns into a complete
repository and `doctor` checks, saying which engine files are still to come until trtllm-build has written them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.manifest import Backend, read_manifest
from trtspec.engine.resolve import MethodRequest, resolve_tree
from trtspec.engine.trtllm_builder import PLAN_FILE, build, is_planned
from trtspec.engine.trtllm_plan import TrtllmBuildOptions, plan_trtllm_build
from trtspec.triton.doctor import doctor


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """A 2-head Medusa and a 4-layer EAGLE checkpoint (float32, K = 63, convert's default) and a tokenizer."""
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("gpu-path")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    out = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("medusa", "eagle"), num_medusa_heads=2)
    return {**out, "tokenizer": root / "tokenizer"}


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def options(ckpt, out, **kwargs):
    return TrtllmBuildOptions(source=ckpt, out=out, **{"max_input_len": 128, "trtllm_version": "1.2", **kwargs})


def flags(p) -> dict[str, str]:
    return dict(zip(p.argv[1::2], p.argv[2::2]))


# ---- 1. the default tree fits the checkpoint -------------------------------------------------------------

def test_two_head_medusa_dry_run_gets_a_default_tree_that_fits(tiny, tmp_path):
    result = run("build", tiny["medusa"], "--backend", "trtllm", "--dry-run", "--out", tmp_path / "e",
                 "--max-input-len", "128", "--trtllm-version", "1.2")
    assert result.exit_code == 0, result.output
    assert "medusa_choices             {0}, {0, 0}" in result.stdout
    assert "the default tree mc_sim_7b_63 does not fit the checkpoint (2 Medusa heads)" in result.stdout
    assert not (tmp_path / "e").exists()  # --dry-run writes nothing


def test_both_backends_share_the_default_tree_rule(tiny):
    from trtspec.checkpoint.model_shape import ModelShape
    from trtspec.engine.manifest import Method

    cfg = ModelShape.from_trtllm(json.loads((tiny["medusa"] / "config.json").read_text()))
    request = MethodRequest(source=tiny["medusa"])
    onnx, gpu = (resolve_tree(cfg, Method.MEDUSA, request, b) for b in (Backend.ONNX, Backend.TRTLLM))
    assert onnx.choices == gpu.choices and gpu.depth == 2  # a chain as deep as the heads, on either backend


def test_an_eagle_checkpoint_whose_layers_the_default_tree_misses_gets_a_chain(write_ckpt, tmp_path):
    ckpt = write_ckpt(tmp_path, "vicuna-7b-eagle", num_eagle_layers=3)
    p = plan_trtllm_build(options(ckpt, tmp_path / "e", max_input_len=1024))
    assert (p.runtime["tree_depth"], p.runtime["tree_nodes"], flags(p)["--max_draft_len"]) == (3, 3, "3")
    assert any(n.startswith("the default tree mc_sim_7b_63 does not fit") for n in p.notes)


# ---- 2. K follows the tree; the notes -----------------------------------------------------------------

FIVE = "[[0],[1],[0,0],[0,1],[1,0]]"


def test_max_draft_len_follows_the_tree_through_a_checkpoint_view(tiny, tmp_path):
    p = plan_trtllm_build(options(tiny["medusa"], tmp_path / "e", choices=FIVE))
    f = flags(p)
    assert f["--max_draft_len"] == "5" and f["--checkpoint_dir"] == str(tmp_path / "e" / "checkpoint")
    assert (p.build_config["max_draft_len"], p.pretrained_config["max_draft_len"], p.manifest.profile.max_draft_len) \
        == (5, 5, 5)
    assert p.checkpoint_view.source == tiny["medusa"] and p.checkpoint_view.max_draft_len == 5
    assert p.to_dict()["checkpoint_view"]["max_draft_len"] == 5
    [view] = [n for n in p.notes if n.startswith("max_draft_len 5 follows the tree (5 nodes; the checkpoint says 63)")]
    assert str(tmp_path / "e" / "checkpoint") in view
    assert not any(" pads the " in n for n in p.notes)


def test_a_max_draft_len_far_beyond_the_tree_gets_one_line_of_its_cost(tiny, tmp_path):
    p = plan_trtllm_build(options(tiny["medusa"], tmp_path / "e", choices=FIVE, max_draft_len=63))
    assert flags(p)["--max_draft_len"] == "63" and p.checkpoint_view is None  # the checkpoint's own K: no view
    assert [n for n in p.notes if " pads the " in n] == [
        "max_draft_len 63 pads the 5-node tree: every generation step feeds 64 tokens per sequence where the tree "
        "needs 6 (10.7x the tokens a verify step computes, free only while the GPU is underused, and 58 more KV-cache "
        "slots per sequence); leave --max-draft-len out to let K follow the tree"]
    assert not any(" pads the " in n for n in plan_trtllm_build(options(tiny["medusa"], tmp_path / "e", choices=FIVE,
                                                                  max_draft_len=9)).notes)  # 10 slots for 6: not far


def test_a_32_node_tree_gets_k_33(write_ckpt, tmp_path):
    ckpt = write_ckpt(tmp_path, "vicuna-7b-medusa")
    choices = json.dumps([[i] for i in range(10)] + [[0, i] for i in range(10)] + [[1, i] for i in range(10)]
                         + [[0, 0, 0], [0, 0, 1]])
    p = plan_trtllm_build(options(ckpt, tmp_path / "e", choices=choices, max_input_len=1024))
    assert (p.runtime["tree_nodes"], p.build_config["max_draft_len"]) == (32, 33)  # K = 32 breaks the packed mask


def test_an_eagle_engine_follows_its_tree_too(tiny, tmp_path, fake_build):
    opts = options(tiny["eagle"], tmp_path / "e", preset="chain_4", tokenizer=tiny["tokenizer"])
    p = plan_trtllm_build(opts)
    assert (p.build_config["max_draft_len"], p.pretrained_config["max_draft_len"]) == (4, 4)
    seen = {}

    def runner(argv, cwd):
        seen["checkpoint"] = Path(argv[argv.index("--checkpoint_dir") + 1])
        seen["config"] = json.loads((seen["checkpoint"] / "config.json").read_text())
        fake_build(argv, cwd)

    manifest = build(opts, runner=runner)  # the stand-in trtllm-build reads the view: its K is the plan's
    assert seen["checkpoint"].parent != tmp_path / "e" and seen["config"]["max_draft_len"] == 4
    assert manifest.profile.max_draft_len == 4 and (tmp_path / "e" / "checkpoint" / "rank0.safetensors").is_symlink()


def test_float32_checkpoint_says_how_to_convert_for_half_precision(tiny, tmp_path):
    p = plan_trtllm_build(options(tiny["medusa"], tmp_path / "e"))
    [note] = [n for n in p.notes if n.startswith("the checkpoint is float32")]
    assert "TensorRT-LLM engines are normally float16 or bfloat16" in note
    command = re.search(r"`(trtspec convert [^`]*)`", note).group(1)
    assert command.endswith("--max-draft-len 2 --dtype float16") and "--medusa " in command
    assert "--num-eagle-layers" not in command  # only the drafter's own flags


def test_each_note_prints_once(tiny, tmp_path):
    result = run("build", tiny["medusa"], "--backend", "trtllm", "--out", tmp_path / "e", "--max-input-len", "128",
                 "--trtllm-version", "1.2")
    assert result.exit_code == 1  # no tensorrt_llm here: the plan, then the one-line stop
    assert result.output.count("one generation-step profile") == 1
    assert result.output.count("the default tree mc_sim_7b_63 does not fit") == 1
    assert "or add --plan-only here to write the engine dir without its engine files" in result.output


# ---- every hint names a flag its command has -----------------------------------------------------------

FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*(?![\w-])")  # trtspec's kebab-case flags only


def hinted_flags(message: str, default: str) -> list[tuple[str, str]]:
    """(command, flag) for each trtspec flag a message names: inside backticks that start `trtspec CMD` the flag is
    CMD's, and so is one later in the same clause (`trtspec build` there, without --plan-only); other backticked
    commands (trtllm-build, quantize.py) are upstream's, not checked; any other flag is the flag of the command that
    printed the message."""
    out, current = [], default
    for i, part in enumerate(message.split("`")):
        if i % 2:
            match = re.match(r"trtspec ([a-z][a-z-]*)", part)
            if match:
                current = match.group(1)
                out += [(current, flag) for flag in FLAG.findall(part)]
            continue
        for j, clause in enumerate(re.split(r";|\.\s|\n", part)):
            current = current if j == 0 else default
            out += [(current, flag) for flag in FLAG.findall(clause)]
    return out


def command_flags(name: str) -> set[str]:
    command = cli.commands[name]
    return {"--help"} | {opt for p in command.params if isinstance(p, click.Option)
                         for opt in (*p.opts, *p.secondary_opts)}


def test_the_flag_finder():
    message = ("pass --max-draft-len 5 or reconvert with `trtspec convert --pp-size 1`; run "
               "`trtllm-build --max_draft_len 5 --output-dir x`, --use_paged_context_fmha --json")
    assert hinted_flags(message, "build") == [("build", "--max-draft-len"), ("convert", "--pp-size"),
                                              ("build", "--json")]
    assert hinted_flags("run `trtspec build` there, without --plan-only. Then --json", "doctor") == [
        ("build", "--plan-only"), ("doctor", "--json")]


def test_every_hint_names_a_flag_that_exists(tiny, write_ckpt, tmp_path, monkeypatch):
    """Every error and note the trtllm build, deploy and doctor paths can be made to print here, checked
    mechanically: each `--flag` it names is an option of the command it names (or of the command that printed it)."""
    import trtspec.engine.trtllm_builder as builder

    medusa, eagle, tok = tiny["medusa"], tiny["eagle"], tiny["tokenizer"]
    plain = write_ckpt(tmp_path, "vicuna-7b", weights=True)
    eagle_pp = write_ckpt(tmp_path / "pp", "vicuna-7b-eagle", mapping={"world_size": 2, "tp_size": 1, "pp_size": 2})
    narrow = write_ckpt(tmp_path / "narrow", "vicuna-7b-eagle", max_non_leaves_per_layer=5)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    small = ["--max-input-len", "128"]
    builds = [
        (medusa, ["--choices", "[[0],[0,0],[0,0,0]]", *small]), (medusa, ["--max-draft-len", "1", *small]),
        (medusa, ["--choices", json.dumps([[i] for i in range(10)] + [[0, i] for i in range(10)]),
                  "--max-draft-len", "32", *small]),
        (eagle, ["--preset", "eagle_25", *small]), (narrow, ["--preset", "mc_sim_7b_63"]), (eagle_pp, []),
        (eagle, ["--max-batch-size", "600", *small]), (eagle, ["--max-draft-len", "300", *small]),
        (plain, ["--max-draft-len", "4"]), (plain, ["--choices", "[[0]]"]), (medusa, ["--lookahead", "7,7,7"]),
        (plain, ["--lookahead", "7,7,7", "--choices", "[[0]]"]),
        (plain, ["--lookahead", "7,7,7", "--max-draft-len", "9"]),
        (plain, ["--lookahead", "7;7;7"]), (plain, ["--lookahead", "1,1,0"]), (plain, ["--draft-target"]),
        (plain, ["--lookahead", "7,7,7", "--draft-target"]),
        (plain, ["--draft-target", "--max-draft-len", "10", "--max-num-tokens", "20"]),
        (plain, ["--max-num-tokens", "100"]), (plain, ["--max-seq-len", "4096"]),
        (plain, ["--max-seq-len", "1024"]), (medusa, []), (medusa, small), (plain, ["--trtllm-version", "0.14"]),
        (plain, ["--trtllm-version", "latest"]), (plain, ["--eagle2", "4,8,63"]), (plain, ["--profiles", "2,4"]),
        (plain, ["--attention", "gqa"]), (plain, ["--int4-scheme", "min"]), (plain, ["--lm-head-weights", "int8"]),
        (plain, ["--dry-run", "--plan-only"]), (hf, []), (plain, ["--choices", "[[0]]", "--preset", "chain_2"]),
        (medusa, ["--choices", FIVE, "--max-draft-len", "63", *small, "--dry-run"]),  # the notes
        (eagle, ["--preset", "chain_4", *small, "--dry-run"]),
    ]
    messages: list[tuple[str, str]] = []
    for ckpt, args in builds:
        result = run("build", ckpt, "--backend", "trtllm", "--out", tmp_path / "e", "--trtllm-version", "1.2", *args)
        assert "Traceback" not in result.output, result.output
        messages.append(("build", result.output))
    # the builder's own stops: no tensorrt_llm (above, `medusa, []`), another version installed
    monkeypatch.setattr(builder, "trtllm_available", lambda: True)
    monkeypatch.setattr(builder, "installed_version", lambda: "0.17.0")
    messages.append(("build", run("build", plain, "--backend", "trtllm", "--out", tmp_path / "e",
                                  "--trtllm-version", "1.2").output))
    monkeypatch.undo()
    # deploy: a planned engine without a tokenizer, a draft-target pair without its draft, a draft on a Medusa engine
    engines = tmp_path / "engines"
    for name, ckpt, args in (("notok", medusa, small), ("medusa", medusa, [*small, "--tokenizer", tok]),
                             ("target", plain, ["--draft-target", "--max-draft-len", "4", "--tokenizer", tok])):
        result = run("build", ckpt, "--backend", "trtllm", "--out", engines / name, "--plan-only", *args)
        assert result.exit_code == 0, result.output
        messages.append(("build", result.output))
    for args in ([engines / "notok"], [engines / "target"], [engines / "medusa", "--draft-engine", engines / "medusa"],
                 [engines / "medusa"]):
        result = run("deploy", *args, "--out", tmp_path / "repo", "--force")
        messages.append(("deploy", result.output))
    messages += [("doctor", str(f)) for f in doctor(tmp_path / "repo")]
    messages += redrafter_messages(tmp_path / "redrafter")

    seen = [(default, command, flag) for default, text in messages for command, flag in hinted_flags(text, default)]
    unknown = sorted({(command, flag) for _, command, flag in seen if flag not in command_flags(command)})
    assert not unknown, unknown
    # the check saw hints of every command the messages point to
    assert {command for _, command, _ in seen} >= {"build", "convert", "deploy"}
    assert ("convert", "--num-eagle-layers") in {(c, f) for _, c, f in seen}
    assert ("build", "--plan-only") in {(c, f) for _, c, f in seen}
    assert {("convert", "--redrafter-num-beams"), ("convert", "--trtllm-version"), ("deploy", "--flavour"),
            ("generate", "--url"), ("build", "--backend")} <= {(c, f) for _, c, f in seen}


def redrafter_messages(root: Path) -> list[tuple[str, str]]:
    """(command, output) of what the ReDrafter paths print: build's refusals and notes, the onnx backend's refusal,
    generate's CPU refusal, doctor's decoding_mode and manifest findings."""
    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.testing import TinyModel, write_hf_base, write_redrafter_drafter, write_tiny_tokenizer

    tokenizer = root / "tokenizer"
    model = TinyModel(vocab_size=write_tiny_tokenizer(tokenizer))
    ckpts = {}
    for name, version in (("new", None), ("old", "0.21")):
        ckpts[name] = root / name
        convert(ConvertOptions(base=write_hf_base(root / "base", model), out=ckpts[name], trtllm_version=version,
                               redrafter=write_redrafter_drafter(root / "drafter", model)), show_progress=False)
    out = []
    for ckpt, args in ((ckpts["new"], ["--max-draft-len", "5"]), (ckpts["new"], ["--no-spec"]),
                       (ckpts["new"], ["--choices", "[[0]]"]), (ckpts["new"], ["--lookahead", "2,2,1"]),
                       (ckpts["new"], ["--weights", "int8"]), (ckpts["new"], ["--trtllm-version", "0.21"]),
                       (ckpts["old"], []), (ckpts["new"], ["--dry-run"])):
        result = run("build", ckpt, "--backend", "trtllm", "--out", root / "e", "--trtllm-version", "1.2",
                     "--max-input-len", "128", *args)
        assert "Traceback" not in result.output, result.output
        out.append(("build", result.output))
    out.append(("build", run("build", ckpts["new"], "--out", root / "e").output))  # the onnx backend
    engine, repo = root / "engine", root / "repo"
    result = run("build", ckpts["new"], "--backend", "trtllm", "--out", engine, "--plan-only", "--trtllm-version", "1.2",
                 "--max-input-len", "128", "--tokenizer", tokenizer)
    assert result.exit_code == 0, result.output
    out += [("build", result.output), ("generate", run("generate", engine, "--prompt", "hi").output)]
    assert run("deploy", engine, "--out", repo).exit_code == 0
    config = repo / "tensorrt_llm" / "config.pbtxt"
    config.write_text(config.read_text().replace('"redrafter"', '"top_k_top_p"'))
    manifest = json.loads((engine / "manifest.json").read_text())
    (engine / "manifest.json").write_text(json.dumps({**manifest, "redrafter": {**manifest["redrafter"],
                                                                                 "num_beams": 1}}))
    found = doctor(repo)
    assert {f.field for f in found if f.severity == "error"} >= {"decoding_mode", "redrafter"}
    return out + [("doctor", str(f)) for f in found]


# ---- 3. deploy from a plan; doctor lists what is still to come -----------------------------------------

def test_plan_only_deploy_doctor_then_the_engine_arrives(tiny, tmp_path, fake_build, caplog):
    engine, repo = tmp_path / "engine", tmp_path / "repo"
    result = run("build", tiny["medusa"], "--backend", "trtllm", "--out", engine, "--plan-only", "--max-input-len",
                 "128", "--trtllm-version", "1.2", "--tokenizer", tiny["tokenizer"], "--max-batch-size", "4")
    assert result.exit_code == 0, result.output
    assert "without its engine files (config.json, rank0.engine)" in result.output
    manifest = read_manifest(engine)
    assert is_planned(engine) and manifest.files == {} and manifest.tokenizer == "tokenizer"
    plan = json.loads((engine / PLAN_FILE).read_text())
    assert plan["engine_files"] == ["config.json", "rank0.engine"]
    assert plan["engine_config"]["build_config"]["max_draft_len"] == 2
    assert plan["engine_config"]["pretrained_config"]["num_medusa_heads"] == 2
    assert json.loads((engine / "checkpoint" / "config.json").read_text())["max_draft_len"] == 2
    assert (engine / "checkpoint" / "rank0.safetensors").resolve() == (tiny["medusa"] / "rank0.safetensors").resolve()

    result = run("deploy", engine, "--out", repo)
    assert result.exit_code == 0, result.output
    assert "is a planned engine: the repository is complete except its engine files (config.json, " \
           "rank0.engine)" in caplog.text  # a warning on stderr
    text = (repo / "tensorrt_llm" / "config.pbtxt").read_text()
    assert str(engine.resolve()) in text and '"{0}, {0, 0}"' in text and "${" not in text
    assert (repo / "launch_triton.sh").is_file()

    findings = doctor(repo)
    assert [f.severity for f in findings if f.severity != "note"] == ["warning"], findings
    [planned] = [f for f in findings if f.field == "engine files"]
    assert planned.message.startswith(f"{engine.resolve()} is a planned engine: config.json, rank0.engine still to "
                                      "come. Run `trtllm-build --checkpoint_dir ")
    result = run("doctor", repo)
    assert result.exit_code == 0 and "warning: tensorrt_llm: engine files:" in result.output
    # the plan's engine config is what doctor checks the repository against meanwhile
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(text.replace('"{0}, {0, 0}"', '"{0}, {0, 0}, {0, 0, 0}"'))
    assert any(f.severity == "error" and f.field == "medusa_choices" and "exceeds the 2 Medusa heads" in f.message
               for f in doctor(repo))
    (repo / "tensorrt_llm" / "config.pbtxt").write_text(text)

    inspect = run("inspect", engine)
    assert inspect.exit_code == 0 and "(planned: no engine files yet)" in inspect.output
    assert "config.json, rank0.engine" in inspect.output and "trtllm-build --checkpoint_dir" in inspect.output

    # the GPU host runs the planned command into the folder; doctor now checks the engine itself
    fake_build(plan["command"], engine)
    assert not [f for f in doctor(repo) if f.severity != "note"], doctor(repo)
    adopted = build(options(tiny["medusa"], engine, tokenizer=tiny["tokenizer"], max_batch_size=4))
    assert adopted.files == {"config": "config.json", "rank0": "rank0.engine"} and not is_planned(engine)
    assert read_manifest(engine) == adopted and adopted.profile.max_draft_len == 2
    assert not [f for f in doctor(repo) if f.severity != "note"]
    (engine / "rank0.engine").unlink()
    assert any(f.severity == "error" and f.field == "engine files" and "lacks rank0.engine" in f.message
               for f in doctor(repo))


def test_a_build_replaces_its_own_plan(tiny, tmp_path, fake_build):
    opts = options(tiny["medusa"], tmp_path / "engine", tokenizer=tiny["tokenizer"])
    result = run("build", tiny["medusa"], "--backend", "trtllm", "--out", tmp_path / "engine", "--plan-only",
                 "--max-input-len", "128", "--trtllm-version", "1.2", "--tokenizer", tiny["tokenizer"], "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["build_config"]["max_draft_len"] == 2
    manifest = build(opts, runner=lambda argv, cwd: fake_build(argv, cwd))  # no --force needed over a plan
    assert manifest.files["rank0"] == "rank0.engine" and (tmp_path / "engine" / "checkpoint").is_dir()
    again = run("build", tiny["medusa"], "--backend", "trtllm", "--out", tmp_path / "engine", "--plan-only",
                "--max-input-len", "128", "--trtllm-version", "1.2")
    assert again.exit_code == 1 and "pass --force to replace it" in again.output  # a built engine is kept


def test_plan_only_and_dry_run_exclude_each_other_and_onnx_refuses_it(tiny, tmp_path):
    both = run("build", tiny["medusa"], "--backend", "trtllm", "--out", tmp_path / "e", "--dry-run", "--plan-only")
    assert both.exit_code != 0 and "not both" in both.output
    onnx = run("build", tiny["medusa"], "--out", tmp_path / "e", "--plan-only")
    assert onnx.exit_code != 0 and "--plan-only applies to --backend trtllm only" in onnx.output
