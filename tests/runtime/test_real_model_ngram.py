"""SmolLM2-135M-Instruct with the training-free drafter on real grounded and open prompts: token-identical to plain
decoding at batch 1 and 8, in an engine of five slot profiles and in one of a single 17-slot profile."""

from __future__ import annotations

import shutil

import pytest

from trtspec import ConvertOptions, convert
from trtspec.data.prompts import load_prompts
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.hub.fetch import fetch_model
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig

pytestmark = pytest.mark.slow

MAX_TOKENS = 48


@pytest.fixture(scope="module")
def generators(module_tmp):
    root = module_tmp
    model = fetch_model("smollm2-135m")
    convert(ConvertOptions(base=model, out=root / "ckpt"), show_progress=False)
    out = {}
    for name, extra in (("profiles", {}), ("one", {"profiles": "17"})):
        build(BuildOptions(source=root / "ckpt", out=root / name, max_draft_len=16, max_input_len=768,
                           max_seq_len=1024, **extra))
        out[name] = LocalGenerator(root / name, threads=2)
    shutil.rmtree(root / "ckpt")  # the engines no longer need it
    yield out


@pytest.fixture(scope="module")
def prompts():
    grounded = load_prompts("sharegpt-grounded", split="measure", limit=4)
    edits = load_prompts("code-edit", split="measure", limit=2)
    return [list(p.messages) for p in (*grounded, *edits, *load_prompts("mt-bench", limit=2))]


def test_ngram_is_token_identical_at_batch_1_and_8_in_every_profile_set(generators, prompts):
    plain_options = GenerationConfig(max_tokens=MAX_TOKENS, no_spec=True)
    ngram_options = GenerationConfig(max_tokens=MAX_TOKENS, method="ngram")
    reference = None
    for name, generator in generators.items():
        fits = [p for p in prompts if len(generator.encode(p)) <= generator.manifest.profile.max_input_len]
        plain = [generator.generate(p, plain_options).output_ids for p in fits]
        alone = [generator.generate(p, ngram_options) for p in fits]
        batched = generator.generate_many(fits, ngram_options)  # in-flight, max_batch_size 8
        assert [g.output_ids for g in alone] == plain, name
        assert [g.output_ids for g in batched] == plain, name
        reference = reference or plain
        assert plain == reference  # the same tokens whatever slot profiles the engine carries
        accepted = sum(g.result.stats.accepted_tokens for g in alone)
        assert accepted > MAX_TOKENS  # grounded prompts copy from their material
        used = set().union(*(g.result.stats.profile_steps for g in alone))
        assert used <= {1, *generator.engine.slot_profiles} and (len(used) >= 3 if name == "profiles" else True)
