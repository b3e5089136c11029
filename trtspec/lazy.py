"""A package's public names, each imported from its module on first use: importing the package stays light (the
command line's startup, the serving path, benchmark children), and callers import from the package, not its modules.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, table: dict[str, str]) -> tuple[Callable[[str], object], list[str]]:
    """(`__getattr__`, `__all__`) for `package`: `table` maps each public name to "module" (the same name in it) or
    "module:name" (another name there). A public name must not be a module of the package: once that module is
    imported, Python binds its name on the package, hiding the export (tests/test_import_graph.py holds this)."""

    def __getattr__(name: str):
        if name not in table:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, _, attr = table[name].partition(":")
        # looked up in its module every time, not cached on the package: what the module holds now (a test's
        # monkeypatch, a reload) is what the package gives
        return getattr(importlib.import_module(module), attr or name)

    return __getattr__, sorted(table)
