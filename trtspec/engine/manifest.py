"""The engine manifest: everything deploy / serve / generate / bench need, written last by `build`.

Frozen, keyword-only dataclasses; `from_dict` rejects unknown keys and lists the valid ones, and
`Manifest.from_dict(m.to_dict()) == m` holds.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import BuildError, ConfigError, check_fields

MANIFEST_FILE = "manifest.json"
MANIFEST_VERSION = 1
# The onnx backend's graph contract (inputs, outputs, KV layout) the runtime runs. Format 1 (manifests without
# `graph_format`): MatMul / Softmax attention, KV cache [P, B, nkv, hd], new rows as outputs of their own.
# Format 2: GroupQueryAttention, KV buffers [B, nkv, capacity, hd] bound as both past and present.
ONNX_GRAPH_FORMAT = 2


class Backend(enum.Enum):
    ONNX = "onnx"
    TRTLLM = "trtllm"


class Method(enum.Enum):
    NONE = "none"
    MEDUSA = "medusa"
    EAGLE = "eagle"  # EAGLE-1 with a static tree
    EAGLE2 = "eagle2"  # EAGLE-2 dynamic tree
    LOOKAHEAD = "lookahead"
    DRAFT_TARGET = "draft_target"


def _from_dict(cls, data: dict, where: str):
    """Build a dataclass from a dict, rejecting unknown keys with the list of valid ones."""
    check_fields(cls, data, where)
    try:
        return cls(**data)
    except TypeError as e:
        raise ConfigError(f"{where}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class Profile:
    """The static shapes the engine was built for; every generation step feeds max_draft_len + 1 slots."""

    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_draft_len: int

    def __post_init__(self):
        for name in ("max_batch_size", "max_input_len", "max_seq_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_draft_len < 0:
            raise ConfigError(f"max_draft_len must be >= 0, got {self.max_draft_len}")
        if self.max_seq_len < self.max_input_len + self.max_draft_len + 1:
            raise ConfigError(
                f"max_seq_len={self.max_seq_len} is below max_input_len={self.max_input_len} + "
                f"max_draft_len={self.max_draft_len} + 1; raise --max-seq-len to at least "
                f"{self.max_input_len + self.max_draft_len + 1} or lower --max-input-len")

    @property
    def tokens_per_step(self) -> int:
        return self.max_draft_len + 1


@dataclass(frozen=True, kw_only=True)
class ModelInfo:
    architecture: str
    dtype: str  # the checkpoint's dtype; the onnx backend computes in float32
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_medusa_heads: int = 0
    num_eagle_layers: int = 0  # EAGLE tree depth the checkpoint was converted for
    draft_layers: int = 0  # EAGLE draft transformer layers
    draft_num_kv_heads: int = 0
    draft_head_dim: int = 0
    end_id: int | None = None
    pad_id: int | None = None
    max_non_leaves_per_layer: int = 0  # EAGLE: most expanding nodes per tree level the engine allows
    logits_dtype: str = "float32"  # the engine's logits dtype (Triton `logits_datatype` must match it)
    draft_vocab_size: int = 0  # EAGLE: target ids the draft lm_head scores (d2t / t2d); 0 = the whole vocabulary


@dataclass(frozen=True, kw_only=True)
class Manifest:
    version: int = MANIFEST_VERSION
    name: str
    backend: Backend
    method: Method
    model: ModelInfo
    profile: Profile
    tree: tuple[tuple[int, ...], ...] | None = None  # choices (medusa / eagle)
    dynamic_tree: dict | None = None  # eagle2: depth, top_k, total_tokens
    files: dict[str, str] = field(default_factory=dict)  # role → path relative to the engine dir
    tokenizer: str | None = None  # relative path of the tokenizer folder, when the source had one
    source: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    numerics: dict[str, float] = field(default_factory=dict)  # max |ORT − reference| / max(1, |reference|) per output
    # lookahead (W, N, G) as {"window_size", "ngram_size", "verification_set_size"}; K = f(W, N, G)
    lookahead: dict[str, int] | None = None
    tp_size: int = 1  # tensor-parallel ranks (trtllm engines: one rank{r}.engine per rank, one MPI rank per GPU)
    pp_size: int = 1
    graph_format: int | None = None  # onnx backend: ONNX_GRAPH_FORMAT of the graphs it built

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["backend"], d["method"] = self.backend.value, self.method.value
        d["tree"] = [list(c) for c in self.tree] if self.tree is not None else None
        return d

    @classmethod
    def from_dict(cls, data: dict, where: str = MANIFEST_FILE) -> Manifest:
        data = dict(data)
        if data.get("version") != MANIFEST_VERSION:
            raise BuildError(f"{where}: manifest version {data.get('version')!r} is not the version this trtspec "
                             f"reads ({MANIFEST_VERSION}); rebuild the engine with this trtspec")
        try:
            data["backend"], data["method"] = Backend(data.get("backend")), Method(data.get("method"))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
        if data["backend"] is Backend.ONNX and data.get("graph_format", 1) != ONNX_GRAPH_FORMAT:
            raise BuildError(f"{where}: the engine's ONNX graphs are of format {data.get('graph_format', 1)!r}, this "
                             f"trtspec runs format {ONNX_GRAPH_FORMAT}; rebuild the engine with this trtspec "
                             "(`trtspec build ... --force`)")
        data["model"] = _from_dict(ModelInfo, data.get("model"), f"{where}: model")
        data["profile"] = _from_dict(Profile, data.get("profile"), f"{where}: profile")
        if data.get("tree") is not None:
            data["tree"] = tuple(tuple(c) for c in data["tree"])
        return _from_dict(cls, data, where)

    def write(self, engine_dir: Path) -> Path:
        """Write manifest.json atomically (temp file + rename): the last file a build writes."""
        path = Path(engine_dir) / MANIFEST_FILE
        fd, tmp = tempfile.mkstemp(dir=engine_dir, prefix=".manifest-")
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
        return path


def read_manifest(engine_dir: Path) -> Manifest:
    """Read and validate an engine dir's manifest, and check that the files it lists exist."""
    engine_dir = Path(engine_dir)
    path = engine_dir / MANIFEST_FILE
    if not path.is_file():
        raise BuildError(f"{engine_dir}: no {MANIFEST_FILE}; not an engine directory (run `trtspec build` first)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: unreadable manifest ({e})") from None
    manifest = Manifest.from_dict(data, str(path))
    for role, rel in manifest.files.items():
        if not (engine_dir / rel).is_file():
            raise BuildError(f"{path}: file {rel} ({role}) is missing from the engine directory")
    return manifest
