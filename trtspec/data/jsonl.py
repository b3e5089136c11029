"""JSON Lines files read one object at a time, a bad line named by file and line number."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from trtspec.errors import ConfigError


def jsonl_objects(path: Path | str) -> Iterator[tuple[str, object]]:
    """(`FILE:LINE`, the parsed value) for every non-blank line; a line that is not JSON is a ConfigError."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{number}", json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(f"{path}:{number}: not JSON ({e.msg})") from None
