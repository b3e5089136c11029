"""Reading and writing safetensors tensor by tensor, checked against the official safetensors library."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch

from trtspec.checkpoint.safetensors_writer import PlannedTensor, write_safetensors
from trtspec.checkpoint.tensorfile import SafetensorsFile, open_tensor_file
from trtspec.errors import CheckpointError

TENSORS = {
    "a.weight": torch.randn(3, 5),
    "b.half": torch.randn(7).half(),
    "c.bf16": torch.randn(2, 2, 2).bfloat16(),
    "d.ids": torch.arange(5, dtype=torch.int64),
    "e.mask": torch.tensor([True, False, True]),
    "f.empty": torch.zeros(0, 4),
}


def _planned():
    return [PlannedTensor(k, tuple(v.shape), v.dtype, lambda v=v: v) for k, v in TENSORS.items()]


def test_streaming_writer_output_reads_back_with_official_library(tmp_path):
    path = tmp_path / "x.safetensors"
    assert write_safetensors(path, _planned()) == path.stat().st_size
    loaded = safetensors.torch.load_file(path)
    assert loaded.keys() == TENSORS.keys()
    assert all(torch.equal(loaded[k], v) for k, v in TENSORS.items())


def test_reader_matches_official_writer(tmp_path):
    path = tmp_path / "y.safetensors"
    safetensors.torch.save_file(TENSORS, path)
    f = SafetensorsFile(path)
    assert {k: i.shape for k, i in f.infos.items()} == {k: tuple(v.shape) for k, v in TENSORS.items()}
    assert all(torch.equal(f.load(k), v) for k, v in TENSORS.items())


@pytest.mark.parametrize("cut", [4, 50, -8])
def test_truncated_file_is_named(tmp_path, cut):
    path = tmp_path / "z.safetensors"
    safetensors.torch.save_file(TENSORS, path)
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut > 0 else data[:cut])
    with pytest.raises(CheckpointError, match=r"z\.safetensors.*(truncated|header)"):
        open_tensor_file(path)


def test_garbage_pickle_is_named(tmp_path):
    path = tmp_path / "pytorch_model.bin"
    path.write_bytes(b"not a pickle at all")
    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin: cannot read torch checkpoint"):
        open_tensor_file(path)
