"""docs/cli.md from the Click commands themselves: every command's `--help`, in the order of the group, so that the
reference cannot drift from the CLI (tests/test_cli_reference.py fails when the file is stale).

    python -m trtspec.cli.reference > docs/cli.md
"""

from __future__ import annotations

import click

WIDTH = 110  # the help text's wrap width, fixed so the file does not depend on the terminal

HEADER = """# Command reference

Every `trtspec` command's `--help`, generated from the commands themselves (`python -m trtspec.cli.reference >
docs/cli.md`; a test fails when this file is stale). What the commands are for and how they fit: the README and
the topic pages beside this one.
"""


def _commands(group: click.Group, ctx: click.Context, prefix: str):
    """(full name, command, context) for the group and every command under it, depth first, in listing order."""
    yield prefix, group, ctx
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if command is None or command.hidden:
            continue
        sub = click.Context(command, info_name=name, parent=ctx, max_content_width=WIDTH, terminal_width=WIDTH)
        if isinstance(command, click.Group):
            yield from _commands(command, sub, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command, sub


def reference() -> str:
    """The markdown of docs/cli.md."""
    from trtspec.cli import cli

    root = click.Context(cli, info_name="trtspec", max_content_width=WIDTH, terminal_width=WIDTH)
    parts = [HEADER]
    entries = list(_commands(cli, root, "trtspec"))
    parts.append("\n".join(f"- [`{name}`](#{_anchor(name)})" for name, _, _ in entries[1:]) + "\n")
    for name, command, ctx in entries:
        parts.append(f"## {name}\n\n```\n{command.get_help(ctx).rstrip()}\n```\n")
    return "\n".join(parts)


def _anchor(name: str) -> str:
    return name.replace(" ", "-")


if __name__ == "__main__":
    print(reference(), end="")
