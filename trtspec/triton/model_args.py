"""What the CPU flavour's Python-backend models read from Triton's `initialize(args)`."""

from __future__ import annotations

from pathlib import Path

TRUE = ("1", "true", "t", "yes", "y")


def parameter(config: dict, key: str, default: str = "") -> str:
    """A `parameters { key … string_value … }` entry of the model config; an unfilled placeholder counts as unset."""
    value = config.get("parameters", {}).get(key, {}).get("string_value", default)
    return default if value.startswith("$" + "{") else value


def flag(config: dict, key: str, default: bool) -> bool:
    return parameter(config, key, str(default).lower()).lower() in TRUE


def model_path(args: dict, config: dict, key: str) -> Path:
    """A path parameter: absolute as written, else relative to the model's folder (`args["model_repository"]`)."""
    path = Path(parameter(config, key))
    return path if path.is_absolute() else Path(args["model_repository"]) / path


def repository_path(repo: Path, value: str) -> Path:
    """A path parameter the engine model resolves against the repository (`engine_dir`, `datastore`): absolute as
    written, else relative to the repository's folder."""
    path = Path(value)
    return path if path.is_absolute() else (Path(repo) / path).resolve()


def served_spin(value: str) -> bool | None:
    """The engine model's `spin` parameter (`deploy --spin/--no-spin`, else "auto") as OrtEngine's `spin`.

    "auto" is None: the engine's own rule, as in `generate` — spin unless the server's environment sets
    TRTSPEC_ORT_SPIN=0, and never for an engine whose drafter runs in a second session. The server owns its cores
    (ONNX Runtime's own default spins too); on a shared host deploy with --no-spin: on a quiet machine spinning
    decodes a little faster with a later first token, with one busy process beside the server it halves the
    speed."""
    return {"true": True, "false": False}.get(value)
