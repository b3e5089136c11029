"""Repetition, presence and frequency penalties: TensorRT-LLM's formula, the draft path counted in each verify row,
speculation lossless against plain decoding with the same penalties (T = 0 exactly, T > 0 in distribution), on a
Markov chain and on tiny ONNX Runtime engines with every drafter."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from tests.speculative.test_ngram import COSTS, MarkovEngine, _deterministic_table
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.loop import GenerationConfig, Request, _constrain, generate, generate_batch
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.ngram_proposer import AcceptanceModel, NgramProposer
from trtspec.speculative.penalties import Penalties, apply_penalties, token_counts
from trtspec.speculative.proposer import NoDraft
from trtspec.speculative.sampling import SamplingParams
from trtspec.speculative.tree import build_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints


def reference(logits: np.ndarray, context: list[int], p: Penalties, temperature: float = 0.0) -> np.ndarray:
    """TensorRT-LLM's batchApplyPenalty, token by token, on logits divided by the temperature (T = 0: by 1), then
    multiplied back (trtspec divides by T when it samples)."""
    t = temperature if temperature > 0 else 1.0
    out = np.array(logits, np.float64) / t
    for token, n in zip(*np.unique(np.asarray(context, np.int64), return_counts=True)):
        x = out[token]
        x = x * p.repetition if x < 0 else x / p.repetition
        out[token] = x - p.presence - p.frequency * n
    return out * t


def test_the_formula_is_tensorrt_llms():
    logits = np.array([[2.0, -2.0, 0.5, 1.0, -0.25]], np.float32)
    p = Penalties(repetition=2.0, presence=0.5, frequency=0.25)
    counts = token_counts([0, 1, 1, 3, 3, 3], 5)
    for temperature in (0.0, 0.7):
        ours = logits.copy()
        apply_penalties(ours, counts, [[]], p, temperature)
        np.testing.assert_allclose(ours[0], reference(logits[0], [0, 1, 1, 3, 3, 3], p, temperature), rtol=1e-6)
    # by hand at T = 0: token 0 seen once, 1 twice, 3 three times, 2 and 4 never
    expected = [2 / 2 - 0.5 - 0.25, -2 * 2 - 0.5 - 0.5, 0.5, 1 / 2 - 0.5 - 0.75, -0.25]
    ours = logits.copy()
    apply_penalties(ours, counts, [[]], p, 0.0)
    np.testing.assert_allclose(ours[0], expected, rtol=1e-6)


def test_each_verify_row_counts_the_draft_tokens_on_its_path():
    tree = build_tree([[0], [0, 0], [1]])
    assert list(tree.parents) == [-1, 0, 0, 1]  # node 1 = [0], node 2 = [1], node 3 = [0, 0]
    draft_tokens = np.array([9, 2, 4, 2])
    logits = np.random.default_rng(0).normal(size=(4, 6)).astype(np.float32)
    p = Penalties(repetition=1.3, presence=0.2, frequency=0.4)
    config = GenerationConfig(penalties=p)
    output, prompt = [1, 2], [0, 1, 5]
    counts = token_counts(prompt + output, 6)
    ours = _constrain(logits, output, draft_tokens, tree, config, counts)
    paths = {0: [], 1: [2], 2: [4], 3: [2, 2]}
    for row, path in paths.items():
        np.testing.assert_allclose(ours[row], reference(logits[row], prompt + output + path, p), rtol=1e-6)
    assert not np.allclose(ours[3], reference(logits[3], prompt + output + [2], p))  # both 2s on the path count


@pytest.mark.parametrize("kwargs,message", [
    ({"repetition": 0.0}, "repetition_penalty must be > 0 (1 is off), got 0.0"),
    ({"presence": float("nan")}, "presence_penalty must be a finite number, got nan"),
    ({"frequency": "1"}, "frequency_penalty must be a finite number, got '1'"),
])
def test_bad_penalties_name_the_field_and_value(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Penalties(**kwargs)


def _hand_rolled_greedy(table: np.ndarray, prompt: list[int], p: Penalties, max_tokens: int) -> list[int]:
    logits, out = np.log(table), []
    for _ in range(max_tokens):
        last = (prompt + out)[-1]
        out.append(int(np.argmax(reference(logits[last], prompt + out, p))))
    return out


PENALTIES = [Penalties(repetition=1.5), Penalties(presence=1.0), Penalties(frequency=0.6),
             Penalties(repetition=1.2, presence=0.3, frequency=0.3)]


@pytest.mark.parametrize("penalties", PENALTIES)
def test_speculation_with_penalties_equals_plain_decoding_with_them_at_t0(penalties):
    table = _deterministic_table(40, seed=3)
    engine = MarkovEngine(table)
    rng = np.random.default_rng(5)
    prompts = [list(np.tile(rng.integers(0, 40, 4), 5)) for _ in range(8)]
    config = GenerationConfig(max_tokens=40, penalties=penalties)
    plain = [generate(engine, p, NoDraft(), config).output_ids for p in prompts]
    assert plain == [_hand_rolled_greedy(table, p, penalties, 40) for p in prompts]
    unpenalized = [generate(engine, p, NoDraft(), GenerationConfig(max_tokens=40)).output_ids for p in prompts]
    assert plain != unpenalized  # the penalty changed the text
    model = AcceptanceModel()
    spec = [generate(engine, p, NgramProposer(COSTS, model=model), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.accepted_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, NgramProposer(COSTS, model=model), config) for p in prompts],
                             max_batch_size=4)
    assert [r.output_ids for r in batched] == plain


def test_speculation_with_penalties_keeps_the_penalized_distribution_at_t1():
    """Three tokens sampled at T = 1 with all three penalties: their joint frequencies over seeded runs follow the
    penalized chain's own probabilities (chi-square p > 1e-4), while drafts are accepted."""
    vocab, runs = 4, 5000
    table = np.random.default_rng(11).dirichlet(np.full(vocab, 0.7), size=vocab)
    engine = MarkovEngine(table)
    prompt = [0, 1, 2, 3] * 4 + [0, 1]
    p = Penalties(repetition=1.3, presence=0.2, frequency=0.05)
    model = AcceptanceModel()
    outcomes, accepted = [], 0
    for seed in range(runs):
        config = GenerationConfig(max_tokens=3, sampling=SamplingParams(temperature=1.0, seed=seed), penalties=p)
        result = generate(engine, np.array(prompt), NgramProposer(COSTS, model=model), config)
        outcomes.append(int(np.ravel_multi_index(result.output_ids, (vocab,) * 3)))
        accepted += result.stats.accepted_tokens

    def step(context):
        z = reference(np.log(table[context[-1]]), context, p, 1.0)
        e = np.exp(z - z.max())
        return e / e.sum()

    expected = np.array([step(prompt)[a] * step(prompt + [a])[b] * step(prompt + [a, b])[c]
                         for a, b, c in itertools.product(range(vocab), repeat=3)])
    counts = np.bincount(outcomes, minlength=vocab ** 3)
    assert chisquare(counts, expected * counts.sum()).pvalue > 1e-4
    assert accepted > runs / 10


MODEL = TinyModel(vocab_size=64)
TREE = "[[0],[1],[0,0],[0,1],[0,0,0]]"


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("penalty-engines")
    ckpts = tiny_trtllm_checkpoints(root / "ckpts", MODEL)
    out = {}
    for name, extra in (("none", {"max_draft_len": 8}), ("medusa", {"choices": TREE}), ("eagle", {"choices": TREE})):
        out[name] = root / name
        build(BuildOptions(source=ckpts[name], out=out[name], max_input_len=64, max_seq_len=160, **extra))
    return out


@pytest.mark.parametrize("name,method", [("none", "ngram"), ("none", "suffix"), ("none", "lookahead"),
                                         ("medusa", "medusa"), ("eagle", "eagle")])
def test_every_drafter_with_penalties_equals_plain_decoding_on_an_engine(engines, name, method):
    engine = OrtEngine(engines[name], threads=1)
    rng = np.random.default_rng(len(method))
    prompts = [np.tile(rng.integers(0, 64, int(rng.integers(2, 5))), 6)[:30] for _ in range(6)]
    # mild: strong penalties keep the text from repeating at all, and the copying drafters would find nothing
    config = GenerationConfig(max_tokens=30, penalties=Penalties(repetition=1.02, presence=0.01, frequency=0.02))

    def proposer():
        tree = {"tree": build_tree(eval(TREE))} if method in ("medusa", "eagle") else {}
        return make_proposer(method, engine, backoff=False, **tree)

    plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
    assert plain != [generate(engine, p, make_proposer("none", engine), GenerationConfig(max_tokens=30)).output_ids
                     for p in prompts]
    spec = [generate(engine, p, proposer(), config) for p in prompts]
    assert [r.output_ids for r in spec] == plain
    assert sum(r.stats.draft_tokens for r in spec) > 0
    batched = generate_batch(engine, [Request(p, proposer(), config) for p in prompts], max_batch_size=4)
    assert [r.output_ids for r in batched] == plain
