"""Every file a command writes has the mode open() gives it (0666 less the umask), temp-then-rename ones too."""

from __future__ import annotations

import os

import numpy as np

from trtspec.checkpoint.draft_vocab import CHECKPOINT_FILE, DraftVocab, write_checkpoint_vocab
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints


def _modes(root):
    return {p.relative_to(root).as_posix(): p.stat().st_mode & 0o777 for p in root.rglob("*") if p.is_file()}


def test_engine_files_manifest_and_verify_curve_follow_the_umask(tmp_path):
    expected = 0o666 & ~_umask()
    ckpt = tiny_trtllm_checkpoints(tmp_path, TinyModel(vocab_size=64), ("none",))["none"]
    engine = tmp_path / "engine"
    build(BuildOptions(source=ckpt, out=engine, max_draft_len=4, max_input_len=16, max_seq_len=64))
    OrtEngine(engine, threads=1).step_costs()  # writes verify_curve.json beside the engine
    modes = _modes(engine)
    assert "manifest.json" in modes and "verify_curve.json" in modes
    assert modes == {name: expected for name in modes}


def test_checkpoint_draft_vocab_follows_the_umask(tmp_path):
    vocab = DraftVocab(np.array([0, 2, 5]), 8)
    write_checkpoint_vocab(tmp_path, vocab)
    assert (tmp_path / CHECKPOINT_FILE).stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask
