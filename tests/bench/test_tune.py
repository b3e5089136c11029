"""`trtspec tune`'s pieces: the offline replay reproduces a real run's steps and acceptance exactly (ngram, suffix,
a Medusa tree), the Medusa paper's greedy tree, the calibration / evaluation split, and the command on a tiny
Medusa engine. No speed is asserted."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from trtspec.bench.medusa_tree import expected_length, greedy_tree, head_accuracies
from trtspec.bench.replay import record_greedy, replay_drafter, replay_tree
from trtspec.bench.tune import TuneOptions, run_tune, split_prompts
from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.runtime.generator import LocalGenerator
from trtspec.runtime.loop import GenerationConfig, generate
from trtspec.speculative.datastore import RecentOutputs
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.ngram_proposer import AcceptanceModel, NgramConfig
from trtspec.speculative.stats import SpecStats
from trtspec.speculative.tree import build_tree
from trtspec.testing import tiny_engine

TEXTS = ["def add(a, b): return a + b. Rewrite add", "The quick brown fox. Repeat.", "Hello world",
         "print(1) print(1) print(1)", "abc abc abc abc", "Summarize: the cat sat on the mat. the cat sat."]
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_engine(tmp_path_factory.mktemp("tune"), max_input_len=96, max_seq_len=192, max_batch_size=2,
                       max_draft_len=8, choices="[[0],[1],[0,0],[0,0,0]]")


@pytest.fixture(scope="module")
def generator(engine):
    return LocalGenerator(engine, threads=1)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tune-prompts") / "p.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": t}) + "\n" for i, t in enumerate(TEXTS)))
    return path


@pytest.fixture(scope="module")
def recordings(generator):
    prompts = [generator.encode(t) for t in TEXTS]
    return prompts, record_greedy(generator, prompts, MAX_TOKENS + generator.engine.max_draft_len,
                                  heads=generator.engine.num_medusa_heads)


def test_recording_is_plain_greedy_with_its_top_rows(generator, recordings):
    prompts, recs = recordings
    config = GenerationConfig(max_tokens=MAX_TOKENS + 8, end_id=generator.manifest.model.end_id)
    for ids, rec in zip(prompts, recs):
        assert rec.output_ids == generate(generator.engine, ids, make_proposer("none", generator.engine),
                                          config).output_ids
        # greedy: each row's best is the token it produced (the end token's row is not recorded)
        assert rec.top[:, 0].tolist() == rec.output_ids[:len(rec.top)] and len(rec.top) >= len(rec.output_ids) - 1
        assert rec.head_ranks.shape == (len(rec.output_ids), generator.engine.num_medusa_heads)


@pytest.mark.parametrize("method, budget", [("ngram", 2), ("ngram", 8), ("suffix", 4)])
def test_replay_reproduces_a_real_run(generator, recordings, method, budget):
    """The replay's steps, slot profiles and acceptance equal a real run's at T = 0, prompt after prompt."""
    prompts, recs = recordings
    engine, config = generator.engine, NgramConfig(max_draft_len=budget)
    costs = engine.step_costs()
    real_state, replay_state = (AcceptanceModel(), RecentOutputs()), (AcceptanceModel(), RecentOutputs())
    run_config = GenerationConfig(max_tokens=MAX_TOKENS, end_id=generator.manifest.model.end_id)
    for ids, rec in zip(prompts, recs):
        real = generate(engine, ids, make_proposer(method, engine, ngram=config, acceptance=real_state[0],
                                                   recent=real_state[1]), run_config)
        replayed = replay_drafter(make_proposer(method, engine, ngram=config, acceptance=replay_state[0],
                                                recent=replay_state[1]), rec, costs, engine.vocab_size, MAX_TOKENS)
        assert (replayed.stats.steps, replayed.stats.accepted_tokens, replayed.stats.draft_tokens) == \
            (real.stats.steps, real.stats.accepted_tokens, real.stats.draft_tokens)
        assert replayed.stats.profile_steps == real.stats.profile_steps
        assert replayed.tokens == len(real.output_ids) - 1


def test_tree_replay_reproduces_a_real_medusa_run(generator, recordings):
    prompts, recs = recordings
    choices = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    engine = generator.engine
    real = SpecStats()
    for ids in prompts:
        real = real.merge(generate(engine, ids, make_proposer("medusa", engine, tree=build_tree(choices)),
                                   GenerationConfig(max_tokens=MAX_TOKENS,
                                                    end_id=generator.manifest.model.end_id)).stats)
    replayed = replay_tree(recs, choices, MAX_TOKENS, engine.step_costs())
    assert (replayed.steps, replayed.accepted_tokens, replayed.draft_tokens) == \
        (real.steps, real.accepted_tokens, real.draft_tokens)


ACCURACIES = [[0.6, 0.2, 0.1], [0.5, 0.15, 0.05], [0.4, 0.1, 0.0]]


@pytest.mark.parametrize("budget, expected", [
    (1, [[0]]),
    (2, [[0], [0, 0]]),  # 0.6 * 0.5 = 0.30 beats [1] at 0.2
    (4, [[0], [0, 0], [1], [0, 0, 0]]),  # 0.3 * 0.4 = 0.12 before [0, 1] at 0.6 * 0.15 = 0.09
    (6, [[0], [0, 0], [1], [0, 0, 0], [1, 0], [2]]),
])
def test_greedy_tree_adds_nodes_by_expected_acceptance(budget, expected):
    choices, tau = greedy_tree(ACCURACIES, budget)
    assert sorted(choices) == sorted(expected)
    assert tau == pytest.approx(expected_length(ACCURACIES, choices))
    assert all(c[:-1] in choices for c in choices if len(c) > 1)  # parents first


def test_greedy_tree_is_best_of_every_tree_of_its_size():
    """Brute force over every prefix-closed tree of 3 nodes in a 2-deep, 2-wide space."""
    import itertools

    accuracies = [[0.5, 0.3], [0.45, 0.2]]
    nodes = [[0], [1], [0, 0], [0, 1], [1, 0], [1, 1]]
    best = max(expected_length(accuracies, list(t)) for t in itertools.combinations(nodes, 3)
               if all(list(c[:-1]) in t for c in t if len(c) > 1))
    assert greedy_tree(accuracies, 3)[1] == pytest.approx(best)


def test_head_accuracies_count_ranks():
    # row j: head h's rank of the token h + 1 after row j's own; the last h + 1 rows have none for head h
    ranks = [np.array([[0, 1], [2, 10], [10, 10]]), np.array([[1, 0], [0, 10]])]
    acc = head_accuracies(ranks, 3)
    assert acc[0] == pytest.approx([1 / 3, 1 / 3, 1 / 3])  # ranks 0, 2 and 1
    assert acc[1] == pytest.approx([0, 1, 0])  # one position only: rank 1


def test_split_never_shares_prompts(generator, prompt_file):
    calibration, evaluation, how = split_prompts(
        TuneOptions(engine=generator.engine.engine_dir, prompt_set=str(prompt_file), calibration=3, evaluation=2),
        generator, show=lambda line: None)
    assert [p.id for p in evaluation] == ["p0", "p1"] and [p.id for p in calibration] == ["p2", "p3", "p4"]
    assert how["evaluation_ids"] == ["p0", "p1"] and "prompts 1-2" in how["evaluation"]


def test_tune_predicts_measures_and_writes_the_winner(engine, prompt_file, tmp_path):
    out = tmp_path / "tuned.yaml"
    result = CliRunner().invoke(cli, ["tune", str(engine), "--prompt-set", str(prompt_file), "--calibration", "3",
                                      "--evaluation", "2", "--max-tokens", "24", "--budget", "2,4,16", "--threads", "1",
                                      "--no-progress", "--json", "--write-recipe", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["budgets"] == [2, 4] and report["budgets_over_k"] == [16]
    names = [s["name"] for s in report["settings"]]
    assert names[:5] == ["none", "ngram/2", "ngram/4", "suffix/2", "suffix/4"] and "medusa (shipped)" in names
    measured = [s for s in report["settings"] if s["measured"] is not None]
    # the best predicted tree stands beside the shipped one, whatever the other methods predict
    assert {"none", "medusa (shipped)"} <= {s["name"] for s in measured}
    assert any(s["name"].startswith("medusa-tree/") for s in measured) or not any(
        s["name"].startswith("medusa-tree/") for s in report["settings"])
    assert all(s["measured"]["speedup_error"] is not None for s in measured)
    assert "none" in [s["name"] for s in measured] and "medusa (shipped)" in [s["name"] for s in measured]
    assert all(s["measured"]["identical"] == "2/2" for s in measured)
    # at T = 0 the replay over the evaluation prompts is the measured run, step for step
    assert all(s["measured"]["replayed_tau"] == s["measured"]["tau"] for s in measured)
    assert report["anchored_curve"]["scale"] > 0
    assert report["winner"]["name"] in report["measured"]
    assert yaml.safe_load(out.read_text())["tuned"]["method"] == report["winner"]["method"]


def test_tune_errors(engine, prompt_file):
    with pytest.raises(ConfigError, match="--budget"):
        TuneOptions(engine=engine, budgets=(0,))
    with pytest.raises(ConfigError, match="calibration"):
        run_tune(TuneOptions(engine=engine, prompt_set=str(prompt_file), evaluation=6, calibration=1,
                             show_progress=False), show=lambda line: None)


def test_tune_runs_an_eagle_engines_own_drafter_on_the_calibration_prompts(prompt_file, tmp_path_factory):
    engine = tiny_engine(tmp_path_factory.mktemp("tune-eagle"), drafter="eagle", max_input_len=96, max_seq_len=192,
                         max_batch_size=2)
    report = run_tune(TuneOptions(engine=engine, prompt_set=str(prompt_file), calibration=2, evaluation=1,
                                  max_tokens=16, budgets=(4,), threads=1, show_progress=False), show=lambda line: None)
    eagle = next(s for s in report["settings"] if s["name"] == "eagle (shipped)")
    assert eagle["predicted"]["calibration"] == "run, not replayed" and eagle["predicted"]["per_position_acceptance"]
    assert eagle["measured"]["identical"] == "1/1" and eagle["measured"]["replayed_tau"] is None


def test_a_quantized_medusa_engine_is_tuned_over_chains(generator, recordings):
    """A quantized engine drafts chains only, so tune predicts chains for it: each budget's top-1 chain and the
    shipped tree's chain, never a tree it would not draft."""
    from dataclasses import replace

    from trtspec.bench.tune import _medusa_trees
    from trtspec.engine.manifest import EngineWeights, WeightFormat
    from trtspec.model.quantize import WeightDtype

    manifest = generator.manifest
    _, trees = _medusa_trees(recordings[1], [2, 3, 8], manifest)
    assert any(c[-1] != 0 for _, choices in trees for c in choices)  # fp32: real trees, with second choices
    int8 = WeightFormat(dtype=WeightDtype.INT8, block_size=32, accuracy_level=4)
    quantized = replace(manifest, weights=EngineWeights(linear=int8, lm_head=int8, embedding=int8))
    _, trees = _medusa_trees(recordings[1], [2, 3, 8], quantized)
    chains = dict(trees)
    assert all(c == [[0] * d for d in range(1, len(c) + 1)] for c in chains.values())
    assert chains["medusa-tree/2"] == [[0], [0, 0]] and chains["medusa (shipped)"] == [[0], [0, 0], [0, 0, 0]]
