"""trtspec: speculative decoding in production — checkpoints with Medusa heads or EAGLE drafts become
engines with padded static-K profiles and Triton model repositories that run the speculative loop.

This module is the library surface; the CLI imports only from here. Torch-dependent parts (convert,
inspect) are imported lazily so the serving path stays free of torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trtspec.errors import (BuildError, CheckpointError, ConfigError, RepositoryError, RuntimeEngineError,
                            ServerError, TrtspecError)

__version__ = "0.1.0"

if TYPE_CHECKING:
    from trtspec.checkpoint.convert import ConvertOptions, ConvertResult
    from trtspec.checkpoint.summary import CheckpointSummary
    from trtspec.checkpoint.trtllm_reader import TrtllmCheckpoint

__all__ = ["BuildError", "CheckpointError", "ConfigError", "RepositoryError", "RuntimeEngineError",
           "ServerError", "TrtspecError", "convert", "inspect_checkpoint", "read_trtllm_checkpoint",
           "ConvertOptions"]

_LAZY = {
    "convert": "trtspec.checkpoint.convert",
    "ConvertOptions": "trtspec.checkpoint.convert",
    "ConvertResult": "trtspec.checkpoint.convert",
    "inspect_checkpoint": "trtspec.checkpoint.summary",
    "CheckpointSummary": "trtspec.checkpoint.summary",
    "read_trtllm_checkpoint": "trtspec.checkpoint.trtllm_reader",
    "TrtllmCheckpoint": "trtspec.checkpoint.trtllm_reader",
}


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'trtspec' has no attribute {name!r}")
    import importlib

    try:
        module = importlib.import_module(_LAZY[name])
    except ModuleNotFoundError as e:
        if e.name == "torch":
            raise ConfigError(f"trtspec.{name} needs torch: pip install 'trtspec[build]'") from None
        raise
    return getattr(module, name)
