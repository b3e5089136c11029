"""Atomic outputs: write into a temporary sibling, rename into place only on success.

Whatever ends the writing early — an exception, Ctrl-C, SIGTERM or SIGHUP — the temporary sibling is removed; the
process then dies of the signal as it would have (exit status 128 + N). A temporary sibling's name carries the id of
the process that made it (`.NAME.tmp-PID-XXXX`), so the next writer of the same output removes those whose process
is gone (a SIGKILL leaves them behind).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from trtspec.errors import ConfigError

log = logging.getLogger(__name__)

CLEANUP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Signalled(KeyboardInterrupt):
    """A SIGTERM / SIGHUP turned into an exception, so that cleanup code runs (as for Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise inside the block; after its cleanup the process dies of the same signal. Only the
    main thread can take signals: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise _Signalled(signum)

    previous = {sig: signal.signal(sig, interrupt) for sig in CLEANUP_SIGNALS}
    try:
        yield
    except _Signalled as e:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)  # die of it, as without us (the default action ends the process here)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _temp_prefix(out: Path, kind: str) -> str:
    return f".{out.name}.{kind}-{os.getpid()}-"


def remove_stale_siblings(out: Path) -> list[Path]:
    """Remove the temporary siblings of `out` (`.NAME.tmp-PID-…`, `.NAME.old-PID-…`) whose process is gone; return
    them. Names without a process id are not trtspec's and are left alone."""
    out = Path(out)
    if not out.parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(out.name)}\.(?:tmp|old)-(\d+)-")
    removed = []
    for sibling in out.parent.iterdir():
        match = pattern.match(sibling.name)
        if match is None:
            continue
        if _alive(int(match.group(1))):
            continue
        shutil.rmtree(sibling, ignore_errors=True) if sibling.is_dir() else sibling.unlink(missing_ok=True)
        log.info("removed %s (left by process %s, which is gone)", sibling, match.group(1))
        removed.append(sibling)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


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
    remove_stale_siblings(out)
    with _signals_interrupt():
        tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(out, "tmp"), dir=out.parent))
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the result should look like any mkdir'd folder
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=_temp_prefix(out, "old"), dir=out.parent))
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
    remove_stale_siblings(out)
    with _signals_interrupt():
        fd, name = tempfile.mkstemp(prefix=_temp_prefix(out, "tmp"), dir=out.parent)
        os.close(fd)
        tmp = Path(name)
        try:
            yield tmp
            chmod_as_created(tmp)
            os.replace(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
