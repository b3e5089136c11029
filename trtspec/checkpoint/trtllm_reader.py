"""Read a TensorRT-LLM checkpoint back: reassemble tensor- and pipeline-parallel shards into full tensors.

Names come back global (`transformer.layers.{i}` over all stages), vocabulary padding is removed, the fused
qkv is returned whole ([q; k; v] with duplicated KV heads folded back); `split_qkv` separates it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtspec.checkpoint.hf_config import read_json
from trtspec.checkpoint.sharding import Mapping, QkvLayout, Split, split_of, unshard
from trtspec.checkpoint.tensorfile import SafetensorsFile
from trtspec.errors import CheckpointError

_LAYER = re.compile(r"^transformer\.layers\.(\d+)\.(.*)$")


@dataclass
class TrtllmCheckpoint:
    """A TensorRT-LLM checkpoint directory opened for reading, one full tensor at a time."""

    directory: Path
    config: dict
    mapping: Mapping
    ranks: list[SafetensorsFile]
    _locations: dict[str, list[tuple[int, str]]] = field(default_factory=dict, repr=False)  # name → [(rank, key)]
    # W4A16_AWQ: the scale tensors beside each packed weight (not listed by names(): the weights read dequantized)
    _awq_scales: dict[str, list[tuple[int, str]]] = field(default_factory=dict, repr=False)

    @property
    def quant_algo(self) -> str | None:
        return (self.config.get("quantization") or {}).get("quant_algo")

    def is_awq_weight(self, name: str) -> bool:
        """A W4A16_AWQ packed weight (int8 [out / 2, in]); `tensor` reads it dequantized, `awq_matrix` as stored."""
        from trtspec.checkpoint.awq import LINEAR_SUFFIXES

        scales = f"{name[:-len('weight')]}weights_scaling_factor"
        return bool(self._awq_scales) and name.endswith(LINEAR_SUFFIXES) and scales in self._awq_scales

    def awq_matrix(self, name: str):
        """A W4A16_AWQ layer's codes, scales and pre-quant scale (checkpoint.awq.AwqMatrix), as stored."""
        from trtspec.checkpoint.awq import read_awq_matrix

        load = lambda locs: self.ranks[locs[0][0]].load(locs[0][1])  # noqa: E731 (tp_size 1: one piece)
        base = name[:-len("weight")]
        scales = self._awq_scales[f"{base}weights_scaling_factor"]
        pre = self._awq_scales.get(f"{base}prequant_scaling_factor")
        return read_awq_matrix(name, load(self._locations[name]), load(scales), None if pre is None else load(pre),
                               self.directory)

    @property
    def architecture(self) -> str:
        return self.config["architecture"]

    def names(self) -> list[str]:
        return list(self._locations)

    def __contains__(self, name: str) -> bool:
        return name in self._locations

    def tensor(self, name: str) -> torch.Tensor:
        """The full (unsharded) tensor; for attention.qkv the concatenation [q; k; v]."""
        return torch.cat(self.tensor_parts(name), dim=0) if split_of(name) is Split.QKV else self.tensor_parts(name)[0]

    def dtype(self, name: str) -> torch.dtype:
        """The stored dtype of a tensor (from the file header; nothing is read)."""
        locs = self._locations.get(name)
        if locs is None:
            raise CheckpointError(f"{self.directory}: no tensor {name}")
        if self.is_awq_weight(name):
            return torch.float32  # read dequantized
        rank, key = locs[0]
        return self.ranks[rank].infos[key].dtype

    def tensor_parts(self, name: str) -> tuple[torch.Tensor, ...]:
        locs = self._locations.get(name)
        if locs is None:
            raise CheckpointError(f"{self.directory}: no tensor {name}")
        if self.is_awq_weight(name):
            pieces = [torch.from_numpy(self.awq_matrix(name).dequantized())]
        else:
            pieces = [self.ranks[rank].load(key) for rank, key in locs]
        return unshard(pieces, split_of(name), self._qkv_layout(name), self.config.get("vocab_size"))

    def split_qkv(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = self.tensor_parts(name)
        return q, k, v

    def num_parameters(self) -> int:
        """Parameters of the unsharded model (replicated tensors counted once, vocab padding included)."""
        total = 0
        for name, locs in self._locations.items():
            sizes = [self.ranks[r].infos[k].numel for r, k in locs]
            total += sizes[0] if split_of(name) is Split.REPLICATE else sum(sizes)
        return total

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.tensor(name) for name in self.names()}

    def _qkv_layout(self, name: str) -> QkvLayout | None:
        if split_of(name) is not Split.QKV:
            return None
        cfg = self.config["eagle_net_config"] if name.startswith("eagle_nets.") else self.config
        heads = cfg["num_attention_heads"]
        head_dim = cfg.get("head_size") or cfg["hidden_size"] // heads
        return QkvLayout(heads, cfg.get("num_key_value_heads") or heads, head_dim)


def read_trtllm_checkpoint(directory: Path) -> TrtllmCheckpoint:
    from trtspec.checkpoint.awq import SCALE_SUFFIXES, W4A16_AWQ

    """Open `directory` (config.json + rank*.safetensors) and index where each tensor's shards live."""
    directory = Path(directory)
    config = read_json(directory / "config.json")
    if "architecture" not in config:
        raise CheckpointError(f"{directory / 'config.json'}: no 'architecture' field; not a TensorRT-LLM checkpoint")
    m = config.get("mapping") or {}
    mapping = Mapping(tp_size=m.get("tp_size", 1), pp_size=m.get("pp_size", 1))
    if m.get("world_size", mapping.world_size) != mapping.world_size:
        raise CheckpointError(f"{directory / 'config.json'}: mapping.world_size={m['world_size']} != tp_size*pp_size")
    ranks = []
    for r in range(mapping.world_size):
        path = directory / f"rank{r}.safetensors"
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (mapping says world_size={mapping.world_size})")
        ranks.append(SafetensorsFile(path))
    ckpt = TrtllmCheckpoint(directory, config, mapping, ranks)
    ckpt._locations = _index(ckpt)
    if ckpt.quant_algo == W4A16_AWQ:
        if mapping.tp_size != 1:
            raise CheckpointError(f"{directory / 'config.json'}: quant_algo=W4A16_AWQ with tp_size={mapping.tp_size}: "
                                  "trtspec reads AWQ checkpoints exported with tp_size 1")
        ckpt._awq_scales = {n: ckpt._locations.pop(n) for n in list(ckpt._locations) if n.endswith(SCALE_SUFFIXES)}
    return ckpt


def _index(ckpt: TrtllmCheckpoint) -> dict[str, list[tuple[int, str]]]:
    """Global name → the (rank, local key) of each TP piece, in tp_rank order."""
    mapping, num_layers = ckpt.mapping, ckpt.config["num_hidden_layers"]
    if num_layers % mapping.pp_size:
        raise CheckpointError(f"{ckpt.directory}: {num_layers} layers do not split evenly over pp_size={mapping.pp_size}")
    locations: dict[str, list[tuple[int, str]]] = {}
    for rank, f in enumerate(ckpt.ranks):
        offset = mapping.pp_layers(num_layers, mapping.pp_rank(rank)).start
        for key in f.infos:
            m = _LAYER.match(key)
            name = f"transformer.layers.{int(m[1]) + offset}.{m[2]}" if m else key
            locations.setdefault(name, []).append((rank, key))
    for name, locs in locations.items():
        if len(locs) != mapping.tp_size:
            raise CheckpointError(f"{ckpt.directory}: tensor {name} is in {len(locs)} rank files, "
                                  f"expected one per tensor-parallel rank ({mapping.tp_size})")
    return locations
