"""`trtspec tree` through CliRunner: JSON buffers, the human summary, the drawing, and its errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trtspec.cli import cli

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run_cli(*args: str):
    """Invoke the CLI in-process, keeping stdout and stderr apart."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_preset_json_is_one_object_with_the_seven_buffers():
    result = run_cli("tree", "--preset", "mc_sim_7b_63", "--json")
    assert result.exit_code == 0, result.output
    assert len(result.stdout.strip().splitlines()) == 1
    data = json.loads(result.stdout)
    assert set(data) == {"num_nodes", "topks", "position_offsets", "tree_ids", "paths", "mask", "packed_mask"}
    assert data["num_nodes"] == 63 and data["topks"] == [10, 10, 10, 2]
    assert data["packed_mask"][-1] == [2051, -2147483520]


def test_choices_summary():
    result = run_cli("tree", "--choices", "[[0],[0,0],[1]]")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "  nodes                      3",
        "  depth                      2",
        "  nodes per level            2, 1",
        "  topks                      2, 1",
        "  leaves (paths)             2",
        "  non-leaves per level       1, 1",
        "  packed-mask words          1",
    ]


def test_cpp_syntax_and_limits_that_hold():
    result = run_cli("tree", "--choices", "{{0}, {0, 0}, {1}}", "--num-heads", "2", "--max-draft-len", "3",
                     "--max-non-leaves-per-layer", "1", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["paths"] == [[0, 1, 3], [0, 2, -1]]


def test_png_is_written(tmp_path):
    out = tmp_path / "tree.png"
    result = run_cli("tree", "--preset", "medusa_small_8", "--png", out)
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == PNG_MAGIC and out.stat().st_size > 1000
    assert result.stderr == f"wrote the tree drawing to {out}\n"
    assert "nodes per level            3, 3, 2" in result.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--choices", "[[0],[0,0],[1,0]]"], "error: tree choice [1, 0] needs its parent [1]"),
    (["--choices", "[[0"], "error: cannot parse tree choices '[[0'"),
    (["--preset", "nope"], "error: unknown tree preset 'nope'; valid presets: mc_sim_7b_63"),
    (["--preset", "eagle_25", "--num-heads", "4"], "error: tree depth 5 exceeds the 4 Medusa heads"),
    (["--preset", "mc_sim_7b_63", "--max-draft-len", "32"], "error: 63 tree nodes need --max-draft-len >= 63"),
    (["--preset", "mc_sim_7b_63", "--max-non-leaves-per-layer", "4"], "error: tree level 1 has 10 non-leaf"),
    (["--preset", "chain_2", "--png", "{tmp}/missing/tree.png"], "error: cannot write the tree drawing"),
])
def test_errors_are_one_line_and_exit_1(tmp_path, args, message):
    result = run_cli("tree", *(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 1
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(message)


@pytest.mark.parametrize("args", [[], ["--preset", "chain_2", "--choices", "[[0]]"]], ids=["neither", "both"])
def test_choices_xor_preset_is_a_usage_error(args):
    result = run_cli("tree", *args)
    assert result.exit_code == 2
    assert "pass exactly one of --choices or --preset" in result.stderr
