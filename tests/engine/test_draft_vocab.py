"""An EAGLE draft with a reduced draft vocabulary (d2t / t2d): the engine's draft scores only those target ids,
the build checks its numerics on them, and speculative output still equals plain greedy output."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.checkpoint.convert import ConvertOptions, convert
from trtspec.checkpoint.draft_vocab import read_checkpoint_vocab
from trtspec.engine.manifest import read_manifest
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base

MODEL = TinyModel(vocab_size=64)
DRAFT_VOCAB = 24


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft-vocab")
    base = write_hf_base(root / "base", MODEL)
    out = {}
    for name, size in (("full", None), ("reduced", DRAFT_VOCAB)):
        draft = write_eagle_draft(root / f"draft-{name}", MODEL, storage="safetensors", draft_vocab_size=size)
        ckpt = root / f"ckpt-{name}"
        convert(ConvertOptions(base=base, out=ckpt, eagle=draft, num_eagle_layers=3), show_progress=False)
        out[name] = build(BuildOptions(source=ckpt, out=root / f"engine-{name}", preset="chain_3", max_input_len=32,
                                       max_seq_len=96))
        out[f"{name}-dir"], out[f"{name}-ckpt"] = root / f"engine-{name}", ckpt
    return out


def test_manifest_and_numerics(engines):
    assert engines["reduced"].model.draft_vocab_size == DRAFT_VOCAB
    assert engines["full"].model.draft_vocab_size == 0
    assert read_manifest(engines["reduced-dir"]) == engines["reduced"]
    draft = {k: v for k, v in engines["reduced"].numerics.items() if k.startswith("draft_")}
    assert draft and max(draft.values()) < 1e-4


def test_draft_scores_only_the_draft_vocabulary(engines):
    vocab = read_checkpoint_vocab(engines["reduced-ckpt"], MODEL.vocab_size).target_ids
    engine = OrtEngine(engines["reduced-dir"])
    seq = engine.open()
    prefill = engine.prefill(seq, np.arange(3, 11))
    out = engine.draft_extend(seq, np.arange(4, 12), prefill.hidden)
    inside = np.zeros(MODEL.vocab_size, bool)
    inside[vocab] = True
    assert np.isfinite(out.logits[:, inside]).all() and np.isneginf(out.logits[:, ~inside]).all()
    assert inside[out.logits.argmax(-1)].all()


def test_speculative_output_equals_plain_greedy(engines):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, MODEL.vocab_size, rng.integers(3, 20)).tolist() for _ in range(8)]
    generator = LocalGenerator(engines["reduced-dir"])
    spec = generator.generate_many(prompts, GenerationConfig(max_tokens=40))
    plain = generator.generate_many(prompts, GenerationConfig(max_tokens=40, no_spec=True))
    assert [g.output_ids for g in spec] == [g.output_ids for g in plain]
    assert sum(g.result.stats.steps for g in spec) > 0
