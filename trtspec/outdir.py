"""Atomic output directories: write into a temporary sibling, rename into place only on success."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from trtspec.errors import ConfigError


def check_output_dir(out: Path, *, force: bool) -> None:
    """Refuse an existing non-empty output directory unless force is set."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output path {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"output directory {out} is not empty; pass --force to replace it")


@contextlib.contextmanager
def atomic_output_dir(out: Path, *, force: bool = False) -> Iterator[Path]:
    """Yield a temporary directory beside `out`; on success it replaces `out`, on failure it vanishes."""
    out = Path(out)
    check_output_dir(out, force=force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the result should look like any mkdir'd folder
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        out.rename(trash / out.name)
        tmp.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(out)


def chmod_as_created(path: Path) -> None:
    """Give a file from tempfile.mkstemp (always 0600) the mode open() would have: 0666 less the process umask."""
    umask = os.umask(0)
    os.umask(umask)
    Path(path).chmod(0o666 & ~umask)


@contextlib.contextmanager
def atomic_output_file(out: Path, *, force: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside `out` to write; on success it replaces `out`, on any failure (an exception,
    Ctrl-C, a SIGTERM turned into KeyboardInterrupt) it is removed and `out` is left as it was."""
    out = Path(out)
    if out.exists() and (out.is_dir() or not force):
        raise ConfigError(f"output path {out} exists" + (" and is a directory" if out.is_dir() else
                                                         "; pass --force to replace it"))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        chmod_as_created(tmp)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
