"""The `trtspec` command line: parse options, call the library, print. No logic lives here.

One module per command family; each registers its commands on the group in `app`."""

from __future__ import annotations

from trtspec.cli import (bench, datastore, generate, models, pipeline, recipe, serving,  # noqa: F401
                         train, tune)  # (register)
from trtspec.cli.app import cli

__all__ = ["cli", "main"]


def main() -> None:
    cli(prog_name="trtspec")
