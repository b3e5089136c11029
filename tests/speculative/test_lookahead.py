"""Lookahead decoding: TensorRT-LLM's (W, N, G) and K, the window laid out as a tree, the n-gram pool, the Jacobi
step, losslessness at T = 0 (batch 1 and 8) and T > 0, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.engine.trtllm_plan import Lookahead
from trtspec.errors import ConfigError
from trtspec.speculative.engine import StepOutput
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.acceptance import Accepted
from trtspec.speculative.lookahead_proposer import LookaheadConfig, LookaheadProposer
from trtspec.speculative.methods import lookahead_config, make_proposer
from trtspec.speculative.proposer import NoDraft
from tests.speculative.test_ngram import MarkovEngine, _deterministic_table, _prompts, assert_keeps_the_target_distribution


@pytest.mark.parametrize("w,n,g", [(4, 3, 4), (7, 7, 7), (2, 2, 1), (5, 4, 1), (2, 5, 3)])
def test_k_is_tensorrt_llms(w, n, g):
    config = LookaheadConfig(w, n, g)
    assert config.max_draft_len == Lookahead(w, n, g).max_draft_len
    assert config.max_decoding_tokens == config.max_draft_len + 1 == (w + g) * (n - 1)


def test_a_full_step_fills_its_slots_with_the_window_and_the_pool():
    config = LookaheadConfig(3, 3, 2)
    proposer = LookaheadProposer(config)
    proposer.start(None, 0, None, np.array([50, 51, 52, 53, 54, 55]), 56)
    proposer.levels[:] = [[0, 10, 11], [20, 21, 22]]  # level 0 (column 0 is the root), level 1
    proposer.pool[56] = __import__("collections").deque([(30, 31), (32, 33)])
    draft = proposer.propose(56)
    assert draft.tree.num_nodes == config.max_draft_len == 9  # nothing merged: (W + G)(N - 1) - 1 nodes
    tree, tokens = draft.tree, draft.tokens.tolist()

    def path(node):
        out = []
        while node > 0:
            out.append(tokens[node])
            node = int(tree.parents[node])
        return out[::-1]

    paths = {tuple(path(i)) for i in range(1, tree.num_nodes + 1)}
    assert {(10,), (10, 11), (20,), (10, 21), (10, 11, 22)} <= paths  # level 0 a chain; columns below it
    assert {(30,), (30, 31), (32,), (32, 33)} <= paths  # the pool's two n-grams after the root


def test_observe_moves_the_window_and_fills_the_pool():
    config = LookaheadConfig(2, 3, 1)
    proposer = LookaheadProposer(config)
    proposer.start(None, 0, None, np.array([1, 2]), 3)
    proposer.levels[:] = [[0, 10], [20, 21]]
    draft = proposer.propose(3)  # slots: root, 10, 20 (column 0 under the root), 21 (column 1 under 10)
    slot = {int(t): i for i, t in enumerate(draft.tokens)}
    logits = np.zeros((len(draft.tokens), 64), np.float32)
    logits[slot[20], 40] = logits[slot[21], 41] = logits[slot[3], 10] = logits[slot[10], 5] = 9.0
    proposer.observe(StepOutput(logits), Accepted((slot[10],), (10, 5), 1))
    assert proposer.levels.tolist() == [[20, 21], [40, 41]]  # each level takes the next; the last the target's
    assert (20, 40) in proposer.pool[3] and (21, 41) in proposer.pool[10]  # column n-grams: root/level 0 first


def test_the_prompt_seeds_the_pool():
    proposer = LookaheadProposer(LookaheadConfig(2, 3, 2))
    proposer.start(None, 0, None, np.array([7, 8, 9, 7, 8, 5]), 6)
    assert list(proposer.pool[7]) == [(8, 5), (8, 9)]  # most recent first
    draft = proposer.propose(7)
    assert draft.tree.num_nodes >= 4


def test_greedy_output_is_plain_greedy_output_batch_1_and_8():
    engine = MarkovEngine(_deterministic_table(12))
    prompts = _prompts(12, 16)
    config = GenerationConfig(max_tokens=40)
    plain = [generate(engine, p, NoDraft(), config).output_ids for p in prompts]
    for wng in ((4, 3, 4), (2, 2, 1), (3, 4, 1)):
        la = LookaheadConfig(*wng)
        alone = [generate(engine, p, LookaheadProposer(la), config) for p in prompts]
        assert [r.output_ids for r in alone] == plain, wng
        batched = generate_batch(engine, [Request(p, LookaheadProposer(la), config) for p in prompts],
                                 max_batch_size=8)
        assert [r.output_ids for r in batched] == plain, wng
        assert sum(r.stats.accepted_tokens for r in alone) > 100, wng  # the chain cycles: the pool catches it


def test_sampled_output_keeps_the_target_distribution():
    assert_keeps_the_target_distribution(lambda: LookaheadProposer(LookaheadConfig(2, 3, 2)))


def test_the_default_fits_the_engine_and_a_request_is_checked_against_it():
    engine = MarkovEngine(_deterministic_table(12), max_draft_len=16)
    assert lookahead_config(engine, None) == LookaheadConfig(4, 3, 4)  # K 15
    engine.max_draft_len = 8
    assert lookahead_config(engine, None) == LookaheadConfig(2, 3, 2)  # K 7
    with pytest.raises(ConfigError, match=r"\(W, N, G\) = 4,3,4 drafts up to 15 tokens a step .* max_draft_len is 8"):
        make_proposer("lookahead", engine, lookahead=LookaheadConfig(4, 3, 4))

    class Manifest:
        lookahead = {"window_size": 2, "ngram_size": 3, "verification_set_size": 2}

    engine.manifest = Manifest()
    assert lookahead_config(engine, None) == LookaheadConfig(2, 3, 2)  # the engine's own
    with pytest.raises(ConfigError, match="window_size 3 exceeds the engine's 2 \\(built for \\(W, N, G\\) = 2,3,2\\)"):
        lookahead_config(engine, LookaheadConfig(3, 2, 1))


@pytest.mark.parametrize("kwargs,message", [
    ({"window_size": 1}, "lookahead window_size must be an int >= 2, got 1"),
    ({"ngram_size": 1}, "lookahead ngram_size must be an int >= 2, got 1"),
    ({"verification_set_size": 0}, "lookahead verification_set_size must be an int >= 1, got 0"),
    ({"window_size": 16, "ngram_size": 5}, "exceeds the draft-tree limits"),
])
def test_config_errors_name_the_value(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LookaheadConfig(**kwargs)


def test_parse_names_the_flag():
    assert LookaheadConfig.parse("4,3,4") == LookaheadConfig(4, 3, 4)
    with pytest.raises(ConfigError, match="--lookahead '4,3': expected W,N,G"):
        LookaheadConfig.parse("4,3")


def test_generate_cli_refuses_a_bad_lookahead_in_one_line(tmp_path):
    from trtspec.cli import cli

    result = CliRunner().invoke(cli, ["generate", str(tmp_path), "--prompt", "hi", "--method", "lookahead",
                                      "--lookahead", "a,b,c"])
    assert result.exit_code == 1 and result.output.strip() == "error: --lookahead 'a,b,c': expected W,N,G (three " \
                                                              "integers, e.g. 4,3,4)"


@pytest.mark.parametrize("own,k,expected", [
    ("none", 0, ("none",)), ("none", 1, ("none", "ngram", "suffix")),
    ("none", 16, ("none", "ngram", "suffix", "lookahead")),
    ("eagle2", 8, ("none", "eagle2", "ngram", "suffix", "lookahead", "hybrid")),
])
def test_runnable_methods_follow_the_engine(own, k, expected):
    from trtspec.speculative.methods import runnable_methods

    assert runnable_methods(own, k) == expected
