"""trtspec: speculative decoding in production — checkpoints with Medusa heads or EAGLE drafts become
engines with padded static-K profiles and Triton model repositories that run the speculative loop.

This module is the library surface: convert, build, deploy, LocalGenerator, GenerationConfig, Method and the error
family. Everything is imported on first use, so `import trtspec` stays light and the serving path free of torch.
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
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.speculative.method import Method
    from trtspec.triton.deploy import deploy
    from trtspec.triton.deploy_options import DeployOptions

__all__ = ["BuildError", "CheckpointError", "ConfigError", "RepositoryError", "RuntimeEngineError",
           "ServerError", "TrtspecError", "convert", "inspect_checkpoint", "read_trtllm_checkpoint",
           "ConvertOptions", "build", "BuildOptions", "deploy", "DeployOptions", "LocalGenerator", "GenerationConfig",
           "Method"]

_LAZY = {
    "convert": "trtspec.checkpoint.convert",
    "ConvertOptions": "trtspec.checkpoint.convert",
    "ConvertResult": "trtspec.checkpoint.convert",
    "inspect_checkpoint": "trtspec.checkpoint.summary",
    "CheckpointSummary": "trtspec.checkpoint.summary",
    "read_trtllm_checkpoint": "trtspec.checkpoint.trtllm_reader",
    "TrtllmCheckpoint": "trtspec.checkpoint.trtllm_reader",
    "build": "trtspec.engine.onnx_builder",
    "BuildOptions": "trtspec.engine.onnx_builder",
    "deploy": "trtspec.triton.deploy",
    "DeployOptions": "trtspec.triton.deploy_options",
    "LocalGenerator": "trtspec.runtime.generator",
    "GenerationConfig": "trtspec.speculative.loop",
    "Method": "trtspec.speculative.method",
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
