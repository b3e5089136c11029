"""What every engine build takes, whichever backend builds it, and the checkpoint config both read first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trtspec.checkpoint.hf_config import read_json
from trtspec.errors import BuildError, ConfigError


@dataclass(frozen=True, kw_only=True)
class EngineBuildOptions:
    source: Path  # a TensorRT-LLM checkpoint folder
    out: Path
    max_draft_len: int | None = None
    choices: str | None = None  # JSON / C++ `{0, 1}` / tuple syntax
    preset: str | None = None
    no_spec: bool = False  # build a plain engine even from a Medusa / EAGLE checkpoint
    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int | None = None
    tokenizer: Path | None = None
    name: str | None = None
    force: bool = False

    def __post_init__(self):
        if self.choices is not None and self.preset is not None:
            raise ConfigError("pass either --choices or --preset, not both")


def read_checkpoint_config(source: Path) -> dict:
    """SOURCE/config.json of a TensorRT-LLM checkpoint; a Hugging Face folder gets the `convert` hint."""
    path = Path(source) / "config.json"
    raw = read_json(path)
    if "architecture" not in raw:
        hint = (f"; it looks like a Hugging Face folder: run `trtspec convert --base {path.parent} --out CKPT` "
                "first" if "architectures" in raw else "")
        raise BuildError(f"{path} has no 'architecture': {path.parent} is not a TensorRT-LLM checkpoint{hint}")
    return raw
