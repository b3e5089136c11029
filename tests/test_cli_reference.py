"""docs/cli.md is the commands' own `--help`: regenerated here and compared, so no synopsis can drift from the CLI."""

from __future__ import annotations

from pathlib import Path

from trtspec.cli.reference import reference

DOC = Path(__file__).resolve().parents[1] / "docs" / "cli.md"


def test_docs_cli_md_is_the_commands_own_help():
    assert DOC.read_text(encoding="utf-8") == reference(), (
        "docs/cli.md is stale: run `.venv/bin/python -m trtspec.cli.reference > docs/cli.md`")


def test_every_command_has_a_section():
    text = reference()
    for command in ("trtspec build", "trtspec generate", "trtspec deploy", "trtspec serve", "trtspec bench run",
                    "trtspec recipe run", "trtspec train eagle"):
        assert f"\n## {command}\n" in text
