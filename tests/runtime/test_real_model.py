"""SmolLM2-135M-Instruct end to end on MT-Bench prompts: speculation is token-identical to --no-spec.

The drafters are untrained (identity-initialised Medusa heads, a random EAGLE draft) until trained ones
ship; losslessness does not depend on their quality, and the identity heads do get some drafts accepted.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from trtspec import ConvertOptions, convert
from trtspec.data.prompts import load_prompts
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.hub.fetch import fetch_model
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.sampling import SamplingParams
from trtspec.speculative.tree import DynamicTree
from trtspec.testing import TinyModel, write_eagle_draft
from trtspec.train.init_heads import write_initial_medusa_heads

pytestmark = pytest.mark.slow

ASSETS = Path(__file__).resolve().parents[2] / "recipes" / "assets"

SMOLLM2 = TinyModel(hidden_size=576, num_layers=30, num_heads=9, num_kv_heads=3, intermediate_size=1536,
                    vocab_size=49152, tie_word_embeddings=True, rope_theta=100000.0, max_position_embeddings=8192)


@pytest.fixture(scope="module")
def engines(module_tmp):
    root = module_tmp
    model = fetch_model("smollm2-135m")
    heads = write_initial_medusa_heads(model, root / "heads", num_heads=3)
    draft = write_eagle_draft(root / "eagle", SMOLLM2, seed=7)
    convert(ConvertOptions(base=model, medusa=heads, out=root / "ckpt-medusa"), show_progress=False)
    convert(ConvertOptions(base=model, eagle=draft, out=root / "ckpt-eagle"), show_progress=False)
    specs = {"medusa": ("ckpt-medusa", {"preset": "medusa_small_8"}),
             "eagle": ("ckpt-eagle", {"preset": "chain_3"}),
             "eagle2": ("ckpt-eagle", {"dynamic_tree": DynamicTree(depth=3, top_k=2, total_tokens=6)})}
    out = {}
    for name, (ckpt, extra) in specs.items():
        build(BuildOptions(source=root / ckpt, out=root / f"engine-{name}", max_input_len=256, max_seq_len=512,
                           **extra))
        out[name] = LocalGenerator(root / f"engine-{name}", threads=2)
    for ckpt in ("ckpt-medusa", "ckpt-eagle"):
        shutil.rmtree(root / ckpt)  # 2.5 GB the engines no longer need
    yield out


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle2"])
def test_smollm2_speculation_is_token_identical_on_mt_bench(engines, method):
    generator = engines[method]
    accepted = 0
    for i, prompt in enumerate(load_prompts("mt-bench", limit=6)):
        # the whole tree every step (the drafter's own acceptance), then backed off: both are plain decoding
        backed_off = generator.generate(list(prompt.messages), GenerationConfig(max_tokens=48), index=i)
        spec = generator.generate(list(prompt.messages), GenerationConfig(max_tokens=48, backoff=False), index=i)
        assert backed_off.output_ids == spec.output_ids, (method, prompt.id)
        plain = generator.generate(list(prompt.messages), GenerationConfig(max_tokens=48, no_spec=True), index=i)
        assert spec.output_ids == plain.output_ids, (method, prompt.id)
        assert spec.text == plain.text and len(plain.output_ids) > 0
        accepted += spec.result.stats.accepted_tokens
    if method == "medusa":
        assert accepted > 0  # identity heads accept repeated tokens now and then


def test_smollm2_answers_a_real_question(engines):
    out = engines["medusa"].generate("What is the capital of France? Answer in one sentence.",
                                     GenerationConfig(max_tokens=32))
    assert "Paris" in out.text and out.result.finish_reason == "end_id"


def test_smollm2_int4_with_the_shipped_eagle_draft_is_lossless(tmp_path):
    """The shipped EAGLE drafter (a reduced draft vocabulary; its embedding is SmolLM2's, so the checkpoint ties it to
    its lm_head) with SmolLM2 at --weights int4: the build's check against the dequantized reference passes for the
    draft graphs too, and EAGLE greedy decoding equals the same engine's plain decoding token for token on MT-Bench
    prompts, in flight and one at a time, with drafts accepted."""
    drafter = ASSETS / "smollm2-135m-eagle"
    tree = json.loads((drafter / "tree.json").read_text())
    convert(ConvertOptions(base=fetch_model("smollm2-135m"), eagle=drafter, num_eagle_layers=tree["num_eagle_layers"],
                           out=tmp_path / "ckpt"), show_progress=False)
    manifest = build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "engine", max_input_len=256,
                                  max_seq_len=512, choices=json.dumps(tree["choices"]), weights="int4"))
    shutil.rmtree(tmp_path / "ckpt")
    assert 0 < manifest.model.draft_vocab_size < manifest.model.vocab_size
    assert manifest.weights.drafter.dtype.value == "int4" and manifest.weights.embedding.dtype.value == "int4"
    draft = [role for role in manifest.numerics if role.startswith("draft_")]
    assert draft and max(manifest.numerics.values()) < NUMERICS_TOLERANCE, manifest.numerics
    generator = LocalGenerator(tmp_path / "engine", threads=2)
    prompts = [list(p.messages) for p in load_prompts("mt-bench", limit=4)]
    config = GenerationConfig(max_tokens=64, sampling=SamplingParams(temperature=0.0))
    plain = generator.generate_many(prompts, dataclasses.replace(config, no_spec=True))
    assert all(len(g.output_ids) > 0 for g in plain)
    eagle = dataclasses.replace(config, method="eagle")
    batched = generator.generate_many(prompts, eagle)  # in flight, where drafting may back off
    assert [g.output_ids for g in batched] == [g.output_ids for g in plain]
    whole = dataclasses.replace(eagle, backoff=False)  # the whole tree every step: its acceptance is the drafter's
    alone = [generator.generate(p, whole, index=i) for i, p in enumerate(prompts)]
    assert [g.output_ids for g in alone] == [g.output_ids for g in plain]
    assert sum(g.result.stats.accepted_tokens for g in alone) > 0
