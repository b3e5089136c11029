"""benchmarks/trees.py: tree parsing, the per-tree summary (the metrics of docs/design.md) and tree.json."""

from __future__ import annotations

import json

import pytest

from benchmarks.trees import TreeResult, parse_tree, write_tree
from trtspec.errors import ConfigError
from trtspec.speculative.stats import SpecStats


@pytest.mark.parametrize("text,choices", [
    ("chain_1", [[0]]),
    ("chain_2", [[0], [0, 0]]),
    ("[[0],[1],[0,0]]", [[0], [1], [0, 0]]),
    ("{{0}, {0, 0}}", [[0], [0, 0]]),
])
def test_parse_tree(text, choices):
    assert parse_tree(text) == choices


def test_parse_tree_rejects_unknown_names():
    with pytest.raises(ConfigError):
        parse_tree("not_a_tree")


def test_summary_uses_the_shared_definitions(tmp_path):
    writing, math = SpecStats(), SpecStats()
    writing.record(drafted=2, depth=2, accepted=2)  # τ 3
    math.record(drafted=2, depth=2, accepted=0)
    math.record(drafted=2, depth=2, accepted=1)  # τ 1.5
    r = TreeResult("chain_2", [[0], [0, 0]], 2, {"writing": writing, "math": math}, spec_s=2.0, plain_s=3.0,
                   spec_decode_s=1.0, plain_decode_s=2.0, tokens=30, identical=2, prompts=2).to_dict()
    assert r["acceptance_length"] == 2.0 and r["acceptance_rate"] == 0.5  # 1 + 3/3, 3/6
    assert r["tau_per_category"] == {"writing": 3.0, "math": 1.5}
    assert r["per_position_acceptance"] == [0.667, 0.5]
    assert (r["speedup"], r["decode_speedup"], r["identical_outputs"]) == (1.5, 2.0, "2/2")
    report = {"method": "eagle", "prompts": "mt-bench, 1 per category", "max_tokens": 16}
    write_tree(tmp_path, report, r)
    tree = json.loads((tmp_path / "tree.json").read_text())
    assert tree["choices"] == [[0], [0, 0]] and tree["num_eagle_layers"] == 2
    assert tree["measured"]["speedup"] == 1.5


@pytest.mark.parametrize("keep", [False, True])
def test_engines_and_checkpoints_are_deleted_once_measured_unless_kept(tmp_path, monkeypatch, keep):
    from benchmarks import trees as spec_eval

    built = []

    def build_engine(args, choices, work):
        spec_eval.checkpoint_dir(args, max(map(len, choices))).mkdir(parents=True, exist_ok=True)
        engine = work / f"engine-{len(built)}"
        (engine / "weights.bin").parent.mkdir(parents=True)
        (engine / "weights.bin").write_bytes(b"0")
        built.append(engine)
        return engine

    def measure(args, tree, choices, engine, prompts):
        assert engine.is_dir()  # still there while it is measured
        stats = SpecStats()
        stats.record(drafted=len(choices), depth=1, accepted=1)
        return TreeResult(tree, choices, 1, {"writing": stats}, spec_s=1.0, plain_s=1.5, spec_decode_s=1.0,
                          plain_decode_s=1.5, tokens=8, identical=1, prompts=1)

    monkeypatch.setattr(spec_eval, "build_engine", build_engine)
    monkeypatch.setattr(spec_eval, "_measure", measure)
    monkeypatch.setattr(spec_eval, "select_prompts", lambda per_category: [])
    argv = ["--base", str(tmp_path), "--eagle", str(tmp_path), "--work", str(tmp_path / "work"), "--tree", "chain_1",
            "--tree", "chain_2", "--json", str(tmp_path / "r.json")] + (["--keep-engines"] if keep else [])
    from click.testing import CliRunner

    from benchmarks.trees import main

    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 0, result.output
    assert len(built) == 2 and all(e.is_dir() == keep for e in built)
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == (
        ["ckpt-eagle-1", "ckpt-eagle-2", "engine-0", "engine-1"] if keep else [])
    assert [r["tree"] for r in json.loads((tmp_path / "r.json").read_text())["results"]] == ["chain_1", "chain_2"]


@pytest.mark.parametrize("argv, message", [
    (["--base", "."], "pass --medusa DIR or --eagle DIR"),
    (["--base", ".", "--eagle", ".", "--medusa", "."], "pass --medusa DIR or --eagle DIR"),
    (["--base", ".", "--eagle", ".", "--batch", "0"], "--batch must be >= 1"),
])
def test_trees_command_refuses_bad_options_in_one_line(argv, message):
    from click.testing import CliRunner

    from benchmarks.trees import main

    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1 and message in result.output, result.output
