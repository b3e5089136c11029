"""Engine files that cannot be silently broken: the manifest records each file's size and a content hash.

A build records every file of the engine dir (graphs, weights, tokenizer) as `checksums` in `manifest.json`:
{relative path: {"size": bytes, "blake2b": hex}}. Opening an engine compares sizes (a stat per file, always: a
truncated `weights.bin` is one line naming it, before ONNX Runtime reads it); `trtspec verify ENGINE`, `deploy` and
`serve` compare the hashes too (BLAKE2b, 128-bit, about a second for SmolLM2-135M's 538 MB). Engines built before
this record nothing and are not checked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

from trtspec.errors import BuildError

HASH = "blake2b"
CHUNK = 8 << 20


def content_hash(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """BLAKE2b-128 of a file's bytes, read in chunks."""
    digest = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return digest.hexdigest()


def record_files(engine_dir: Path, relative_paths: Iterable[str]) -> dict[str, dict]:
    """{path: {"size", "blake2b"}} for each file (folders: every file below them), sorted by path."""
    engine_dir = Path(engine_dir)
    records = {}
    for rel in relative_paths:
        path = engine_dir / rel
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file():
                name = file.relative_to(engine_dir).as_posix()
                records[name] = {"size": file.stat().st_size, HASH: content_hash(file)}
    return dict(sorted(records.items()))


def check_sizes(engine_dir: Path, checksums: dict[str, dict]) -> None:
    """Every recorded file is there with its recorded size (a stat each); else one line naming the file."""
    for rel, record in checksums.items():
        path = Path(engine_dir) / rel
        if not path.is_file():
            raise BuildError(f"{path}: missing (the engine's manifest lists it); rebuild the engine")
        size = path.stat().st_size
        if size != record["size"]:
            raise BuildError(f"{path}: {size} bytes, the manifest says {record['size']} (truncated or replaced "
                             "after the build); rebuild the engine")


def verify_files(engine_dir: Path, checksums: dict[str, dict],
                 on_bytes: Callable[[int], None] | None = None) -> int:
    """Sizes, then every file's hash against the manifest's; returns the bytes read. One line naming the first file
    that differs."""
    check_sizes(engine_dir, checksums)
    total = 0
    for rel, record in checksums.items():
        path = Path(engine_dir) / rel
        found = content_hash(path, on_bytes)
        if found != record[HASH]:
            raise BuildError(f"{path}: content hash {found} differs from the manifest's {record[HASH]} (the file "
                             "changed after the build); rebuild the engine")
        total += record["size"]
    return total
