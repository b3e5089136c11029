"""The drain handshake between `trtspec serve` and the engine model (standard library only: `serve` imports it
on SIGTERM, when an import of numpy and the runtime would cost a loaded machine a third of a second)."""

from __future__ import annotations

from pathlib import Path


class DrainSignal:
    """How `trtspec serve` drains the engine model before it stops tritonserver, through files (the stub processes
    share nothing else with it): `PATH` — take no new requests; `PATH.end` — the drain time is over, end what is
    left with an error; the model answers with `PATH.idle` once nothing is left. Stopping Triton first would not
    do: on SIGTERM it unloads every model with nothing in flight, postprocessing among them, so the ensemble's
    streams in flight could never finish (Triton 2.51)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def requested(self) -> bool:
        return self.path.exists()

    def over(self) -> bool:
        return self.path.with_name(self.path.name + ".end").exists()

    def report_idle(self) -> None:
        self.path.with_name(self.path.name + ".idle").touch()

    # the server's side
    def start(self) -> None:
        self.path.touch()

    def end(self) -> None:
        self.path.with_name(self.path.name + ".end").touch()

    def idle(self) -> bool:
        return self.path.with_name(self.path.name + ".idle").exists()
