"""recipe: one YAML file for a whole pipeline."""

from __future__ import annotations

from pathlib import Path

import click

from trtspec.cli.app import cli, user_errors


@cli.group()
def recipe() -> None:
    """Recipes: one YAML file for base, drafter, convert, build and deploy."""


@recipe.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workdir", default=".", show_default=True, help="Folder the printed commands write under.")
@user_errors
def recipe_check(file: Path, workdir: str) -> None:
    """Validate a recipe and print the commands that run it, one per line."""
    from trtspec.recipe import command_lines, load_recipe

    for line in command_lines(load_recipe(file), workdir):
        click.echo(line)
