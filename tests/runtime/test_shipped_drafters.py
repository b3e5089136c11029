"""The drafters shipped for SmolLM2-135M (recipes/assets) through convert → build (their tree.json) → generate on
MT-Bench prompts: output identical to plain greedy decoding, and drafts do get accepted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtspec import ConvertOptions, convert
from trtspec.data.prompts import load_prompts
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.hub.fetch import fetch_model
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig

pytestmark = pytest.mark.slow

ASSETS = Path(__file__).resolve().parents[2] / "recipes" / "assets"


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_shipped_drafter_is_lossless_and_accepted(tmp_path, method):
    drafter = ASSETS / f"smollm2-135m-{method}"
    tree = json.loads((drafter / "tree.json").read_text())
    depth = {"eagle": {"num_eagle_layers": tree.get("num_eagle_layers")},
             "medusa": {"num_medusa_heads": tree.get("num_medusa_heads")}}[method]
    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt", **{method: drafter}, **depth),
            show_progress=False)
    manifest = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "engine",
                                  choices=json.dumps(tree["choices"]), max_input_len=256, max_seq_len=512))
    if method == "eagle":  # the shipped EAGLE draft scores a reduced vocabulary (d2t / t2d)
        assert 0 < manifest.model.draft_vocab_size < manifest.model.vocab_size
    generator = LocalGenerator(tmp_path / "engine")
    prompts = [list(p.messages) for p in load_prompts("mt-bench", limit=4)]
    # the whole tree every step: its acceptance is the drafter's (backed off, it may rest where it does not pay)
    spec = generator.generate_many(prompts, GenerationConfig(max_tokens=48, backoff=False))
    plain = generator.generate_many(prompts, GenerationConfig(max_tokens=48, no_spec=True))
    backed_off = generator.generate_many(prompts, GenerationConfig(max_tokens=48))
    assert [g.output_ids for g in spec] == [g.output_ids for g in plain] == [g.output_ids for g in backed_off]
    steps = sum(g.result.stats.steps for g in spec)
    accepted = sum(g.result.stats.accepted_tokens for g in spec)
    assert accepted / steps > 0.05, (accepted, steps)
