"""Rich progress bars on stderr, one shared look for every long-running step."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

_console = Console(stderr=True)


@contextlib.contextmanager
def progress_bar(description: str, *, total: int, enabled: bool = True) -> Iterator[Callable[[], None]]:
    """Yield an `advance(amount=1)` callable that moves a progress bar (a no-op when disabled)."""
    if not enabled:
        yield lambda amount=1: None
        return
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=_console, transient=False) as progress:
        task = progress.add_task(description, total=total)
        yield lambda amount=1: progress.advance(task, amount)


class StatusBar:
    """A bar with time remaining and a live status field (loss, tokens/s), for training and data generation:
    `with StatusBar("epoch 1", total=n) as bar: bar.advance(1, "loss 2.31")`; a no-op when disabled."""

    def __init__(self, description: str, *, total: int, enabled: bool = True):
        self.description, self.total, self.enabled = description, total, enabled
        self._progress: Progress | None = None

    def __enter__(self) -> StatusBar:
        if self.enabled:
            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[status]}"),
                                      console=_console)
            self._progress.__enter__()
            self._task = self._progress.add_task(self.description, total=self.total, status="")
        return self

    def advance(self, n: int = 1, status: str | None = None) -> None:
        if self._progress is not None:
            fields = {} if status is None else {"status": status}
            self._progress.update(self._task, advance=n, **fields)

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)
