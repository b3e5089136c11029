"""A rich progress bar on stderr with a live status field (loss, tokens/s), trtspec's look for training."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from trtspec.progress import _console


class TrainBar:
    """`with TrainBar("epoch 1", total=n) as bar: bar.advance(1, "loss 2.31")`; a no-op when disabled."""

    def __init__(self, description: str, *, total: int, enabled: bool = True):
        self.description, self.total, self.enabled = description, total, enabled
        self._progress: Progress | None = None

    def __enter__(self) -> TrainBar:
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
