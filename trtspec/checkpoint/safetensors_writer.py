"""Streaming safetensors writer: the header is planned from shapes, then tensors are produced and written one
at a time, so writing a rank file never holds more than one tensor in memory."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.checkpoint.tensorfile import DTYPE_CODES


@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to be written: its name, shape and dtype are known before its data is computed."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    produce: Callable[[], torch.Tensor]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


def write_safetensors(path: Path, planned: Sequence[PlannedTensor],
                      on_written: Callable[[PlannedTensor], None] | None = None) -> int:
    """Write `planned` to `path` in safetensors format; return the number of bytes written."""
    header: dict[str, dict] = {}
    offset = 0
    for p in planned:
        header[p.name] = {"dtype": DTYPE_CODES[p.dtype], "shape": list(p.shape),
                          "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the format aligns the data section to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for p in planned:
            t = p.produce()
            # a mismatch here is a planning bug, not a user error
            assert tuple(t.shape) == p.shape and t.dtype == p.dtype, (p.name, t.shape, p.shape, t.dtype)
            if t.numel():
                f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)
            if on_written:
                on_written(p)
    return 8 + len(blob) + offset
