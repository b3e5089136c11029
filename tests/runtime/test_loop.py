"""The speculative loop on the torch reference engine: lossless at temperature 0 for every method."""

from __future__ import annotations

import numpy as np
import pytest
import safetensors.torch
import torch

from trtspec import ConvertOptions, convert
from trtspec.errors import ConfigError
from trtspec.speculative.loop import GenerationConfig, generate
from trtspec.model.torch_engine import TorchEngine
from trtspec.speculative.tree import DynamicTree
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.proposer import Draft
from trtspec.speculative.sampling import SamplingParams
from trtspec.speculative.tree import build_tree, chain_tree
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

MODEL = TinyModel(vocab_size=64, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
TREE = build_tree([[0], [1], [2], [0, 0], [0, 1], [1, 0], [0, 0, 0], [0, 0, 1], [0, 0, 0, 0]])
N_PROMPTS = 50


def _prompts(seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, MODEL.vocab_size, size=int(rng.integers(1, 40))) for _ in range(N_PROMPTS)]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("engines")
    base = write_hf_base(root / "base", MODEL)
    heads = write_medusa_heads(root / "medusa", MODEL, num_heads=4)
    # identity heads: zero ResBlocks over the base lm_head predict "the same token again", which the
    # repetitive greedy output of a random tiny model often accepts
    ident = write_medusa_heads(root / "ident", MODEL, variant="safetensors", num_heads=4, per_head_lm_head=False)
    weights = safetensors.torch.load_file(ident / "medusa_lm_head.safetensors")
    safetensors.torch.save_file({k: torch.zeros_like(v) for k, v in weights.items()},
                                ident / "medusa_lm_head.safetensors")
    eagle = write_eagle_draft(root / "eagle", MODEL)
    out = {}
    for name, kwargs in (("medusa", {"medusa": heads}), ("ident", {"medusa": ident}),
                         ("eagle", {"eagle": eagle, "num_eagle_layers": 4})):
        convert(ConvertOptions(base=base, out=root / f"ckpt-{name}", max_draft_len=16, **kwargs), show_progress=False)
        out[name] = TorchEngine.from_checkpoint(root / f"ckpt-{name}")
    return out


class OracleProposer:
    """Drafts the true greedy continuation down a random part of the rank-0 path, wrong tokens elsewhere:
    exercises acceptance, KV compaction, and stops inside accepted drafts."""

    def __init__(self, reference: list[int], seed: int):
        self.reference, self.rng, self.pos = reference, np.random.default_rng(seed), 0

    def start(self, engine, seq, prefill, prompt_ids, root):
        self.pos = 1  # reference[0] is the root

    def propose(self, root):
        true_depth = int(self.rng.integers(0, TREE.depth + 1))
        tokens = np.empty(TREE.num_nodes + 1, dtype=np.int64)
        tokens[0] = root
        for node in range(1, TREE.num_nodes + 1):
            depth, on_path = TREE.position_offsets[node], all(c == 0 for c in TREE.choices[node - 1])
            truth = self.reference[min(self.pos + depth - 1, len(self.reference) - 1)]
            good = on_path and depth <= true_depth
            tokens[node] = truth if good else (truth + 1 + TREE.ranks[node]) % MODEL.vocab_size
        return Draft(TREE, tokens)

    def observe(self, verify, accepted):
        self.pos += len(accepted.tokens)


def _run(engine, prompt, proposer, **kw):
    return generate(engine, prompt, proposer, GenerationConfig(**kw))


def _cases(engine, prompts, seed=1):
    """Per prompt: max_tokens in 1..24 and, for every third prompt, an end id taken from the plain output."""
    rng = np.random.default_rng(seed)
    cases = []
    for i, prompt in enumerate(prompts):
        max_tokens = int(rng.integers(1, 25))
        plain = _run(engine, prompt, make_proposer("none", engine), max_tokens=32).output_ids
        end_id = plain[int(rng.integers(1, len(plain)))] if i % 3 == 0 else None
        cases.append((prompt, max_tokens, end_id))
    return cases


@pytest.mark.parametrize("engine_name,method", [("medusa", "medusa"), ("ident", "medusa"), ("eagle", "eagle"),
                                                ("eagle", "eagle2"), ("medusa", "oracle")])
def test_speculative_equals_plain_greedy(engines, engine_name, method):
    engine = engines[engine_name]
    accepted = 0
    for i, (prompt, max_tokens, end_id) in enumerate(_cases(engine, _prompts())):
        kw = {"max_tokens": max_tokens, "end_id": end_id}
        plain = _run(engine, prompt, make_proposer("none", engine), **kw)
        if method == "oracle":
            reference = _run(engine, prompt, make_proposer("none", engine), max_tokens=64).output_ids
            proposer = OracleProposer(reference, seed=i)
        else:
            proposer = make_proposer(method, engine, tree=TREE, dynamic=DynamicTree(depth=3, top_k=3, total_tokens=10))
        spec = _run(engine, prompt, proposer, **kw)
        assert spec.output_ids == plain.output_ids, (i, method)
        assert spec.finish_reason == plain.finish_reason
        accepted += spec.stats.accepted_tokens
    if engine_name == "ident" or method == "oracle":
        assert accepted > 20  # the comparison covered accepted drafts, not only rejections


def test_stops_inside_accepted_drafts_are_exercised(engines):
    """The oracle run must include steps whose accepted tokens were cut by end_id and by max_tokens."""
    engine = engines["medusa"]
    cut = {"end_id": 0, "length": 0}
    for i, (prompt, max_tokens, end_id) in enumerate(_cases(engine, _prompts())):
        reference = _run(engine, prompt, make_proposer("none", engine), max_tokens=64).output_ids
        chunks, commits = [], []
        commit = engine.commit
        engine.commit = lambda seq, slots: (commits.append(len(slots)), commit(seq, slots))[1]
        try:
            res = generate(engine, prompt, OracleProposer(reference, seed=i),
                           GenerationConfig(max_tokens=max_tokens, end_id=end_id), on_tokens=chunks.append)
        finally:
            del engine.commit
        if commits and len(chunks[-1]) < commits[-1]:  # the last step produced more tokens than were emitted
            cut[res.finish_reason] += 1
    assert cut["end_id"] > 0 and cut["length"] > 0, cut


@pytest.mark.parametrize("method", ["medusa", "eagle", "eagle2"])
def test_top_k_one_sampling_is_greedy(engines, method):
    engine = engines["eagle" if method.startswith("eagle") else "ident"]
    sampling = SamplingParams(temperature=0.9, top_k=1, seed=3)
    for prompt in _prompts(seed=5)[:10]:
        plain = _run(engine, prompt, make_proposer("none", engine), max_tokens=16)
        proposer = make_proposer(method, engine, tree=TREE, dynamic=DynamicTree(depth=3, top_k=2, total_tokens=6))
        assert _run(engine, prompt, proposer, max_tokens=16, sampling=sampling).output_ids == plain.output_ids


@pytest.mark.parametrize("method", ["none", "medusa", "eagle2"])
def test_sampling_is_reproducible_with_a_seed(engines, method):
    """A seed gives the same sampled text when the drafts are the same: whole trees (--no-backoff). Backed off,
    how much is drafted follows the drafter's measured time, so sampled text keeps its distribution, not its draws."""
    engine = engines["eagle" if method == "eagle2" else "medusa"]
    outputs = []
    for _ in range(2):
        proposer = make_proposer(method, engine, tree=TREE, dynamic=DynamicTree(depth=2, top_k=2, total_tokens=4),
                                 backoff=False)
        outputs.append(_run(engine, _prompts()[0], proposer, max_tokens=20,
                            sampling=SamplingParams(temperature=1.0, seed=11)).output_ids)
    assert outputs[0] == outputs[1] and len(outputs[0]) == 20


def test_stats_follow_the_shared_definitions(engines):
    engine = engines["ident"]
    res = _run(engine, _prompts()[3], make_proposer("medusa", engine, tree=TREE, backoff=False), max_tokens=40)
    s = res.stats
    assert s.draft_tokens == s.steps * TREE.num_nodes
    assert s.acceptance_length == pytest.approx(1 + s.accepted_tokens / s.steps)
    assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.draft_tokens)
    assert len(res.output_ids) <= 1 + s.steps + s.accepted_tokens  # prefill token + one bonus per step + accepted
    assert len(s.per_position_acceptance) == TREE.depth


def test_stop_words_end_generation(engines):
    engine = engines["medusa"]
    prompt = _prompts()[1]
    plain = _run(engine, prompt, make_proposer("none", engine), max_tokens=20).output_ids
    stop = tuple(plain[4:6])
    for method in ("none", "medusa"):
        res = _run(engine, prompt, make_proposer(method, engine, tree=TREE), max_tokens=20, stop_words=(stop,))
        first = next(i for i in range(len(plain) - 1) if tuple(plain[i:i + 2]) == stop)
        assert res.output_ids == plain[:first + 2] and res.finish_reason == "stop_word"


@pytest.mark.parametrize("method,engine_name,kwargs,message", [
    ("medusa", "eagle", {"tree": TREE}, "needs an engine built from a Medusa checkpoint"),
    ("eagle", "medusa", {"tree": TREE}, "needs an engine built from an EAGLE checkpoint"),
    ("medusa", "medusa", {"tree": chain_tree(17)}, "max_draft_len is 16"),
    ("medusa", "medusa", {"tree": chain_tree(5)}, "tree depth 5 exceeds the 4 Medusa heads"),
    ("eagle2", "eagle", {}, "drafts EAGLE-2.s dynamic tree and this engine was built with a static .EAGLE-1. tree: "
                            "use --method eagle, or rebuild it with `trtspec build .* --eagle2 DEPTH,TOP_K,TOTAL_TOKENS`"),
    ("eagle", "eagle", {"dynamic": DynamicTree(depth=2, top_k=2, total_tokens=4)}, "use --method eagle2"),
    ("beam", "medusa", {}, "method 'beam' is not one of none, medusa"),
])
def test_method_errors(engines, method, engine_name, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        make_proposer(method, engines[engine_name], **kwargs)


def test_log_probs_are_the_same_with_and_without_speculation():
    """Emitted tokens' log probabilities come from the verify rows that produced them: equal to plain decoding."""
    import numpy as np

    from trtspec.speculative.loop import GenerationConfig, generate
    from trtspec.model.torch_engine import TorchEngine
    from trtspec.speculative.methods import make_proposer
    from trtspec.speculative.tree import build_tree
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = tiny_trtllm_checkpoints(Path(tmp), TinyModel(vocab_size=64), ("medusa",))["medusa"]
        engine = TorchEngine.from_checkpoint(ckpt, max_draft_len=4)
        config = GenerationConfig(max_tokens=20, return_log_probs=True)
        tree = build_tree([[0], [0, 0], [1]])
        spec = generate(engine, [1, 2, 3], make_proposer("medusa", engine, tree=tree), config)
        plain = generate(engine, [1, 2, 3], make_proposer("none", engine), config)
    assert spec.output_ids == plain.output_ids and len(spec.log_probs) == 20
    np.testing.assert_allclose(spec.log_probs, plain.log_probs, atol=1e-4)
    assert max(spec.log_probs) <= 0


def test_bad_words_and_min_tokens_stay_lossless():
    """Constraints are applied per tree row in that row's own context: speculation equals plain decoding."""
    import tempfile
    from pathlib import Path

    from trtspec.speculative.loop import GenerationConfig, generate
    from trtspec.model.torch_engine import TorchEngine
    from trtspec.speculative.methods import make_proposer
    from trtspec.speculative.tree import build_tree
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = tiny_trtllm_checkpoints(Path(tmp), TinyModel(vocab_size=64), ("medusa",))["medusa"]
        engine = TorchEngine.from_checkpoint(ckpt, max_draft_len=6)
        tree = build_tree([[0], [0, 0], [1], [0, 1], [0, 0, 0]])
        free = generate(engine, [5, 6, 7], make_proposer("none", engine), GenerationConfig(max_tokens=30))
        out = free.output_ids
        end_id = out[4]
        words = ((out[1],), tuple(out[6:8]), tuple(out[10:13]))
        for config in (GenerationConfig(max_tokens=30, bad_words=words),
                       GenerationConfig(max_tokens=30, end_id=end_id, min_tokens=12),
                       GenerationConfig(max_tokens=30, end_id=end_id, min_tokens=12, bad_words=words)):
            spec = generate(engine, [5, 6, 7], make_proposer("medusa", engine, tree=tree), config)
            plain = generate(engine, [5, 6, 7], make_proposer("none", engine), config)
            assert spec.output_ids == plain.output_ids
            for word in config.bad_words:
                ids = spec.output_ids
                assert all(tuple(ids[i:i + len(word)]) != word for i in range(len(ids)))
            if config.min_tokens:
                assert end_id not in spec.output_ids[:12]
        assert spec.output_ids != out


def test_hybrid_merges_a_drafter_with_prompt_lookup_losslessly(engines):
    """An oracle drafter (right down part of its rank-0 path) merged with prompt lookup on repetitive prompts: the
    output is plain greedy, and nodes of both kinds are accepted."""
    from trtspec.speculative.hybrid_proposer import HybridProposer
    from trtspec.speculative.ngram_proposer import DRAFTER, AcceptanceModel, NgramConfig
    from trtspec.speculative.step_costs import StepCosts

    engine, model = engines["medusa"], AcceptanceModel()
    costs = StepCosts((1, 2, 3, 5, 9, 17), (1.0, 1.06, 1.09, 1.13, 1.34, 1.60))
    for i, prompt in enumerate(_prompts(seed=3)):
        prompt = np.concatenate([prompt, prompt[:6]])
        plain = _run(engine, prompt, make_proposer("none", engine), max_tokens=24)
        reference = _run(engine, prompt, make_proposer("none", engine), max_tokens=64).output_ids
        proposer = HybridProposer(OracleProposer(reference, seed=i), costs, NgramConfig(), model=model,
                                  max_draft_len=16)
        spec = _run(engine, prompt, proposer, max_tokens=24)
        assert spec.output_ids == plain.output_ids, i
    accepted = {k[0] for k, (hits, _) in model.counts.items() if hits}
    assert DRAFTER in accepted and accepted - {DRAFTER}
