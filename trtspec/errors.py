"""The one error hierarchy of trtspec: every user-facing failure is a TrtspecError with a one-line message."""

from __future__ import annotations

import dataclasses


class TrtspecError(Exception):
    """A failure caused by the user's input or environment; the CLI prints it as one line and exits 1."""


class ConfigError(TrtspecError):
    """A configuration value or flag combination is invalid."""


class CheckpointError(TrtspecError):
    """A checkpoint on disk is missing, malformed, or inconsistent with another."""


class BuildError(TrtspecError):
    """An engine cannot be built from the given checkpoint and profile."""


class RuntimeEngineError(TrtspecError):
    """The engine runtime failed to serve a request."""


class NativeLibraryError(TrtspecError):
    """trtspec's compiled ONNX Runtime ops (trtspec/native) are not built, or cannot be built or loaded."""


class RepositoryError(TrtspecError):
    """A Triton model repository cannot be written or is inconsistent."""


class ServerError(TrtspecError):
    """The Triton server cannot be found, started or reached."""


def check_fields(cls, data: object, where: str, *, container: str = "an object") -> dict:
    """`data` as the keyword arguments of dataclass `cls`: a ConfigError names `where` when it is not a mapping
    or has a key `cls` lacks (with the valid keys; a field with metadata {"key": False} is not one)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected {container}, found {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls) if f.metadata.get("key", True)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(names))}")
    return data
