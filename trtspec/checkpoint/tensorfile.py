"""Lazy, tensor-by-tensor access to checkpoint files: safetensors (single or sharded) and torch pickles.

Safetensors are read with plain positioned reads (no mmap), so converting a shard keeps only the tensors in
flight resident, never the whole file.
"""

from __future__ import annotations

import json
import re
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from trtspec.errors import CheckpointError

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
DTYPE_CODES = {v: k for k, v in SAFETENSORS_DTYPES.items()}
MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor lives and what it looks like, known without reading its data."""

    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    path: Path

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


class SafetensorsFile:
    """One safetensors file: header parsed and validated up front, tensors read on demand."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._entries, self._data_start = _read_safetensors_header(self.path)
        self.infos = {
            key: TensorInfo(key, tuple(e["shape"]), SAFETENSORS_DTYPES[e["dtype"]], self.path)
            for key, e in self._entries.items()
        }

    def load(self, key: str) -> torch.Tensor:
        info = self.infos[key]
        begin, end = self._entries[key]["data_offsets"]
        out = torch.empty(info.shape, dtype=info.dtype)
        buf = out.reshape(-1).view(torch.uint8).numpy() if info.numel else None
        with open(self.path, "rb") as f:
            f.seek(self._data_start + begin)
            if buf is not None and f.readinto(buf) != end - begin:
                raise CheckpointError(f"{self.path}: truncated while reading tensor {key}")
        return out


def _read_safetensors_header(path: Path) -> tuple[dict, int]:
    """Parse and validate a safetensors header; return (entries, byte offset of the data section)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw_len = f.read(8)
            if len(raw_len) < 8:
                raise CheckpointError(f"{path}: not a safetensors file ({size} bytes, header missing)")
            (n,) = struct.unpack("<Q", raw_len)
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors file (header claims {n} bytes, file has {size})")
            header = json.loads(f.read(n))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: safetensors header is a JSON {type(header).__name__}, not an object")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for key, e in header.items():
        _check_entry(path, key, e, data_len)
    return header, 8 + n


def _check_entry(path: Path, key: str, e: dict, data_len: int) -> None:
    if not (isinstance(e, dict) and _int_list(e.get("shape")) and _int_list(e.get("data_offsets"))
            and len(e["data_offsets"]) == 2 and 0 <= e["data_offsets"][0] <= e["data_offsets"][1]):
        raise CheckpointError(f"{path}: tensor {key} has a malformed header entry {e!r} "
                              "(needs dtype, shape, data_offsets)")
    if e.get("dtype") not in SAFETENSORS_DTYPES:
        raise CheckpointError(f"{path}: tensor {key} has unsupported dtype {e.get('dtype')!r}")
    begin, end = e["data_offsets"]
    numel = 1
    for d in e["shape"]:
        numel *= d
    if end - begin != numel * SAFETENSORS_DTYPES[e["dtype"]].itemsize:
        raise CheckpointError(f"{path}: tensor {key} has shape {e['shape']} but {end - begin} bytes of data")
    if end > data_len:
        raise CheckpointError(
            f"{path}: truncated safetensors file: tensor {key} ends at data byte {end} "
            f"but the file holds only {data_len}")


def _int_list(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)


class TorchPickleFile:
    """A torch.save state dict (`pytorch_model.bin`, `medusa_lm_head.pt`), memory-mapped when possible."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._tensors = _load_torch_state_dict(self.path)
        self.infos = {k: TensorInfo(k, tuple(t.shape), t.dtype, self.path) for k, t in self._tensors.items()}

    def load(self, key: str) -> torch.Tensor:
        return self._tensors[key]


def _load_torch_state_dict(path: Path) -> dict[str, torch.Tensor]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about legacy pickle protocols; the result decides
            try:
                obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                obj = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) format
    except Exception as e:  # torch raises many types for corrupt pickles; keep its first line only
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(e))
        reason = (f"it holds a non-tensor object ({found[1]}); re-save it as a plain state dict of tensors" if found
                  else f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0]}")
        raise CheckpointError(f"{path}: cannot read torch checkpoint ({reason})") from None
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise CheckpointError(f"{path}: expected a flat state dict of tensors, found {type(obj).__name__}")
    return obj


def open_tensor_file(path: Path) -> SafetensorsFile | TorchPickleFile:
    """Open a weights file by its format (safetensors by extension, otherwise a torch pickle)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    return SafetensorsFile(path) if path.suffix == ".safetensors" else TorchPickleFile(path)


class TensorStore:
    """A named set of tensors spread over one or more files, read one tensor at a time."""

    def __init__(self, entries: dict[str, tuple[SafetensorsFile | TorchPickleFile, str]], directory: Path):
        self._entries = entries
        self.directory = Path(directory)

    @classmethod
    def from_files(cls, files: list[SafetensorsFile | TorchPickleFile], directory: Path) -> TensorStore:
        entries: dict = {}
        for f in files:
            for key in f.infos:
                if key in entries:
                    raise CheckpointError(f"{f.path}: tensor {key} also appears in {entries[key][0].path}")
                entries[key] = (f, key)
        return cls(entries, directory)

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def info(self, key: str) -> TensorInfo:
        f, k = self._entries[key]
        i = f.infos[k]
        return TensorInfo(key, i.shape, i.dtype, i.path)

    def load(self, key: str) -> torch.Tensor:
        f, k = self._entries[key]
        return f.load(k)

    @property
    def files(self) -> list[Path]:
        return sorted({f.path for f, _ in self._entries.values()})

    def with_prefix(self, prefix: str) -> TensorStore:
        """The tensors whose key starts with `prefix`, with the prefix removed."""
        sub = {k[len(prefix):]: v for k, v in self._entries.items() if k.startswith(prefix)}
        return TensorStore(sub, self.directory)

    def without_prefixes(self, prefixes: tuple[str, ...]) -> TensorStore:
        sub = {k: v for k, v in self._entries.items() if not k.startswith(prefixes)}
        return TensorStore(sub, self.directory)


HF_WEIGHT_FILES = ("model.safetensors.index.json", "model.safetensors",
                   "pytorch_model.bin.index.json", "pytorch_model.bin")


def open_hf_weights(directory: Path) -> TensorStore:
    """Open the weights of a Hugging Face model folder: single or sharded safetensors, or pytorch_model.bin."""
    directory = Path(directory)
    for name in HF_WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".index.json"):
                return _open_sharded(path)
            return TensorStore.from_files([open_tensor_file(path)], directory)
    raise CheckpointError(f"{directory}: no weights found (looked for {', '.join(HF_WEIGHT_FILES)})")


def _open_sharded(index_path: Path) -> TensorStore:
    try:
        weight_map = json.loads(index_path.read_text())["weight_map"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise CheckpointError(f"{index_path}: not a valid shard index ({type(e).__name__}: {e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: weight_map must map tensor names to shard files, "
                              f"found {type(weight_map).__name__}")
    files = {name: open_tensor_file(index_path.parent / name) for name in sorted(set(weight_map.values()))}
    store = TensorStore.from_files(list(files.values()), index_path.parent)
    for key, name in weight_map.items():
        if key not in files[name].infos:
            raise CheckpointError(f"{index_path}: weight_map puts {key} in {name}, which does not contain it")
    extra = set(store.keys()) - set(weight_map)
    if extra:
        raise CheckpointError(f"{index_path}: shards hold tensors missing from weight_map: {sorted(extra)[:3]}")
    return store
