"""The `trtspec` group and what every command shares: path types, the one-line user error, flag checks."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

import click

import trtspec
from trtspec.errors import TrtspecError

DIR = click.Path(file_okay=False, path_type=Path)
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


def user_errors(fn):
    """Turn TrtspecError into one line on stderr and exit code 1 (TRTSPEC_DEBUG=1 keeps the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrtspecError as e:
            if os.environ.get("TRTSPEC_DEBUG"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return wrapper


SPIN_HELP = ("ONNX Runtime's intra-op workers spin between ops: about 15% faster decoding on cores nothing else "
             "uses, much slower on a shared machine: pass --no-spin there (default: spin, or TRTSPEC_ORT_SPIN=0 "
             "for off; engines whose drafter runs in a second session spin only with --spin).")


@click.group()
@click.version_option(trtspec.__version__, prog_name="trtspec")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages to stderr.")
def cli(verbose: bool) -> None:
    """Speculative decoding in production: checkpoints → static-K engines → Triton repositories."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(message)s",
                        stream=sys.stderr)
    from trtspec.model import quiet_numpy_subnormal_warning

    quiet_numpy_subnormal_warning()  # numpy's, once anything has turned flush-to-zero on (ort_session.session_options)


def _sampling_flag(param: click.Parameter, value):
    """--temperature / --top-k / --top-p checked as the flag the user typed (SamplingParams' rule, one line)."""
    from trtspec.speculative import RULES, SamplingParams

    try:
        SamplingParams(**{param.name: value})
    except TrtspecError:
        raise click.BadParameter(f"must be {RULES[param.name]}, got {value}") from None
    return value
