"""TensorRT-LLM versions trtspec targets (the 0.15–1.2.x engine flow) and what changes between them.

One table, read by the build plan (`trtllm-build` flags), the repository writer (which `config.pbtxt` keys and
tensor names exist) and the README (which NGC container each version ships in). Each rule cites the public
upstream file it follows; `docs/upstream-sources.md` lists them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trtspec.errors import ConfigError

# TensorRT-LLM docs/source/release-notes.md: EAGLE (examples/eagle) arrived in 0.15; the TensorRT engine flow for Medusa, EAGLE-1/2 and
# lookahead is frozen after 1.2.x (the PyTorch backend, default since 1.0, does not run them).
OLDEST = (0, 15)
NEWEST = (1, 2)
SUPPORTED_MINORS = ((0, 15), (0, 16), (0, 17), (0, 18), (0, 19), (0, 20), (0, 21), (1, 0), (1, 1), (1, 2))

# the NGC Triton release notes: the `<yy.mm>-trtllm-python-py3` Triton container that ships each version. Only
# the pairings the reference verified are listed; the others are left to NGC's release notes.
CONTAINERS: dict[tuple[int, int], str] = {
    (0, 15): "24.11",
    (0, 17): "25.01",
    (0, 18): "25.03",
    (0, 21): "25.08",
    (1, 0): "25.09",  # 25.10 too
    (1, 1): "25.12",  # 26.01, 26.02 too
    (1, 2): "26.04",  # 1.2.1 in 26.04-26.07 (25.11 ships 1.2.0rc2, 26.03 1.2.0rc8)
}

_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?((?:rc|\.dev|\.post|a|b)\S*)?$")


@dataclass(frozen=True)
class TrtllmVersion:
    """A TensorRT-LLM release (major, minor) and the features of its engine flow and Triton templates."""

    major: int
    minor: int
    text: str  # as given, e.g. "1.2.1" or "0.17"

    @property
    def key(self) -> tuple[int, int]:
        return self.major, self.minor

    def at_least(self, major: int, minor: int) -> bool:
        return self.key >= (major, minor)

    @property
    def short(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def container(self) -> str | None:
        """The NGC Triton image that ships this version, when the reference verified the pairing."""
        tag = CONTAINERS.get(self.key)
        return f"nvcr.io/nvidia/tritonserver:{tag}-trtllm-python-py3" if tag else None

    # ---- Triton templates (tensorrtllm_backend tools/fill_template.py "When keys appeared") --------------------

    @property
    def has_eagle_choices(self) -> bool:
        return self.at_least(0, 16)  # `eagle_choices` parameter: v0.16

    @property
    def has_logits_datatype(self) -> bool:
        return self.at_least(0, 17)  # `${logits_datatype}` on tensorrt_llm, ensemble, BLS: v0.17

    @property
    def has_lookahead_parameters(self) -> bool:
        return self.at_least(0, 19)  # executor-level lookahead_{window,ngram,verification_set}_size: v0.19

    @property
    def has_preprocessing_batching(self) -> bool:
        return self.at_least(0, 19)  # preprocessing dynamic_batching + queue keys: v0.19

    @property
    def newest_input_names(self) -> bool:
        """`min_tokens` / `seed` instead of `min_length` / `random_seed`, from 0.20 on.

        tensorrtllm_backend v0.19.0 (c1e1963) is the last tag whose templates it ships itself, with the old names
        (`all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt`, `inflight_batcher_llm/src/utils.h`
        `minLength = "min_length"`, `randomSeed = "random_seed"`). The rename is commit c2e65b8 ("Update
        TensorRT-LLM backend (#749)", 2025-05-13), which renames both in utils.h and every template and keeps no
        alias for the old names; it is not on the 0.19 release branch. From v0.20.0 on the backend's tags carry no
        templates, only the TensorRT-LLM submodule (v0.20.0 → NVIDIA/TensorRT-LLM@7965842, whose
        `triton_backend/all_models/` copy is the post-rename sync: TensorRT-LLM 0.20.0's release notes list
        "Migrate Triton Backend to TensorRT LLM repo"). So 0.20 is the first release with the new names.
        `trtspec doctor` says which names a repository expects and reports one whose steps disagree.
        """
        return self.at_least(0, 20)


def parse_version(text: str) -> TrtllmVersion:
    """Parse "X.Y" or "X.Y.Z[rcN]" and check it lies in the supported 0.15–1.2.x range."""
    match = _VERSION.match(str(text).strip())
    if not match:
        raise ConfigError(f"--trtllm-version {text!r} is not a version; write it as X.Y or X.Y.Z, e.g. 1.2")
    version = TrtllmVersion(int(match[1]), int(match[2]), str(text).strip())
    if version.key not in SUPPORTED_MINORS:
        raise ConfigError(f"--trtllm-version {text} is outside the TensorRT-LLM engine flow trtspec targets "
                          f"({_fmt(OLDEST)}–{_fmt(NEWEST)}.x: EAGLE needs 0.15, the engine flow is frozen after "
                          f"1.2); pick one of {', '.join(_fmt(v) for v in SUPPORTED_MINORS)}")
    return version


def newest() -> TrtllmVersion:
    return TrtllmVersion(*NEWEST, _fmt(NEWEST))


def installed_version() -> str | None:
    """The installed tensorrt_llm distribution's version, without importing it (that needs a GPU)."""
    import importlib.metadata as md

    for dist in ("tensorrt_llm", "tensorrt-llm"):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def _fmt(key: tuple[int, int]) -> str:
    return f"{key[0]}.{key[1]}"
