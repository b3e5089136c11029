"""A package's public names, each imported from its module on first use: importing the package stays light (the
command line's startup, the serving path, benchmark children), and callers import from the package, not its modules.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], object], list[str]]:
    """(`__getattr__`, `__all__`) for `package`: `table` maps each public name to "module" (the same name in it) or
    "module:name" (another name there)."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = table[name].partition(":")
        value = getattr(importlib.import_module(module), attr or name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    return __getattr__, sorted(table)
