"""A reduced draft vocabulary: the draft scores only the target tokens it is likely to propose.

EAGLE-3 introduced it (`d2t` / `t2d` in the draft's safetensors: target_id = draft_id + d2t[draft_id], t2d a
[vocab] mask of the target ids kept). trtspec reads the same two tensors from EAGLE-1 drafts too (its own
trained drafts carry them): on a CPU the draft's lm_head over the whole vocabulary costs about a fifth of a
base decoding step per draft depth, over 8 k tokens about a thirtieth. Tokens outside the draft vocabulary are
never proposed, so the output is unchanged (the base verifies every token); only acceptance can drop, by the
share of base tokens outside it.

In a TensorRT-LLM checkpoint the map travels as `draft_vocab.safetensors` beside the rank files (trtllm-build
never reads it: TensorRT-LLM's EAGLE-1 engine drafts over the whole vocabulary).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trtspec.errors import CheckpointError

CHECKPOINT_FILE = "draft_vocab.safetensors"


@dataclass(frozen=True)
class DraftVocab:
    """The target ids the draft scores, strictly increasing (draft id i is target id target_ids[i])."""

    target_ids: np.ndarray  # [Vd] int64
    vocab_size: int  # the target's

    @property
    def size(self) -> int:
        return len(self.target_ids)

    @classmethod
    def from_maps(cls, d2t: torch.Tensor, t2d: torch.Tensor, *, vocab_size: int, where: str) -> DraftVocab:
        """Validate EAGLE-3's maps: d2t [Vd] offsets, t2d [vocab] mask; the ids must be a strictly increasing
        subset of the vocabulary, marked in t2d and nowhere else."""
        if d2t.dim() != 1 or tuple(t2d.shape) != (vocab_size,):
            raise CheckpointError(f"{where}: d2t has shape {list(d2t.shape)} and t2d {list(t2d.shape)}, expected "
                                  f"[draft_vocab_size] and [{vocab_size}] (the target's vocab_size)")
        target = torch.arange(len(d2t)) + d2t.long()
        mask = t2d.bool()
        if len(target) == 0 or target.min() < 0 or target.max() >= vocab_size or not bool(mask[target].all()):
            raise CheckpointError(f"{where}: d2t maps draft ids outside the target ids marked in t2d")
        if int(mask.sum()) != len(target):
            raise CheckpointError(f"{where}: t2d marks {int(mask.sum())} target ids, d2t has {len(target)}")
        if len(target) > 1 and not bool((target[1:] > target[:-1]).all()):
            raise CheckpointError(f"{where}: d2t must map draft ids to strictly increasing target ids")
        return cls(target.numpy().astype(np.int64), vocab_size)

    @classmethod
    def from_target_ids(cls, target_ids, vocab_size: int) -> DraftVocab:
        ids = np.unique(np.asarray(target_ids, np.int64))
        if len(ids) == 0 or ids[0] < 0 or ids[-1] >= vocab_size:
            raise CheckpointError(f"a draft vocabulary needs 1..{vocab_size} ids in [0, {vocab_size})")
        return cls(ids, vocab_size)

    def maps(self) -> dict[str, torch.Tensor]:
        """{"d2t": int64 [Vd], "t2d": bool [vocab]}, EAGLE-3's tensors."""
        t2d = torch.zeros(self.vocab_size, dtype=torch.bool)
        t2d[torch.from_numpy(self.target_ids)] = True
        return {"d2t": torch.from_numpy(self.target_ids - np.arange(self.size)), "t2d": t2d}


def write_checkpoint_vocab(directory: Path, vocab: DraftVocab) -> None:
    from safetensors.torch import save_file

    from trtspec.outdir import chmod_as_created

    path = Path(directory) / CHECKPOINT_FILE
    save_file(vocab.maps(), str(path), metadata={"format": "pt"})
    chmod_as_created(path)  # safetensors writes 0600, every other output file has the umask's mode


def read_checkpoint_vocab(directory: Path, vocab_size: int) -> DraftVocab | None:
    """The draft vocabulary of a TensorRT-LLM checkpoint, or None (the draft scores the whole vocabulary)."""
    path = Path(directory) / CHECKPOINT_FILE
    if not path.is_file():
        return None
    from safetensors import safe_open

    try:
        with safe_open(str(path), "pt") as f:
            maps = {k: f.get_tensor(k) for k in ("d2t", "t2d") if k in f.keys()}
    except Exception as e:  # safetensors raises its own types for torn files
        raise CheckpointError(f"{path}: cannot read it ({e})") from None
    if len(maps) != 2:
        raise CheckpointError(f"{path}: needs tensors d2t and t2d")
    return DraftVocab.from_maps(maps["d2t"], maps["t2d"], vocab_size=vocab_size, where=str(path))
