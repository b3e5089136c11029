"""Rich progress bars on stderr, one shared look for every long-running step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

_console = Console(stderr=True)


@contextlib.contextmanager
def progress_bar(description: str, *, total: int, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Yield an `advance()` callable that moves a progress bar (a no-op when disabled)."""
    if not enabled:
        yield lambda: None
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda: progress.advance(task)
