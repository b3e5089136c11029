"""`trtspec tune`'s pieces: the offline replay reproduces a real run's steps and acceptance exactly (ngram, suffix,
a Medusa tree, an EAGLE-1 tree over the teacher-forced draft's ranks), the Medusa paper's greedy tree, the
calibration / evaluation split, and the command on tiny Medusa and EAGLE engines. No speed is asserted."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.tune import eagle_tree
from trtspec.tune.medusa_tree import expected_length, greedy_tree, head_accuracies
from trtspec.tune.replay import record_greedy, replay_drafter, replay_tree
from trtspec.tune.tuner import TuneOptions, run_tune, split_prompts
from trtspec.recipe.tuned import write_winner_recipe
from trtspec.cli import cli
from trtspec.data.prompts import PROMPT_SETS
from trtspec.errors import ConfigError
from trtspec.recipe.schema import load_recipe
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig, generate
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
        real = real.merge(generate(engine, ids, make_proposer("medusa", engine, tree=build_tree(choices), backoff=False),
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


def test_a_set_stored_by_category_is_split_across_its_categories(tmp_path):
    """MT-Bench lists ten writing prompts, then ten roleplay, ...: evaluation and calibration are both drawn across
    the categories, never share a prompt, come out the same every time, and the evaluation is what `bench --limit`
    measures."""
    from trtspec.bench.workload import load_bench_prompts

    options = TuneOptions(engine=tmp_path, prompt_set="mt-bench", calibration=12, evaluation=4)
    calibration, evaluation, how = split_prompts(options, None, show=lambda line: None)
    assert [p.id for p in evaluation] == [p.id for p in load_bench_prompts("mt-bench", limit=4)]
    assert how["evaluation_categories"] == {"writing": 1, "roleplay": 1, "reasoning": 1, "math": 1}
    # every category calibrates, none more than twice
    assert set(how["calibration_categories"]) == set(PROMPT_SETS["mt-bench"].categories)
    assert max(how["calibration_categories"].values()) == 2 and len(calibration) == 12
    assert not {p.id for p in calibration} & {p.id for p in evaluation}
    assert split_prompts(options, None, show=lambda line: None)[2] == how
    assert "spread across its categories, prompts 1-4 (what `trtspec bench --limit 4` measures)" in how["evaluation"]
    assert "--evaluation 8 --calibration 16 measures one of each" in how["note"]
    eight = split_prompts(TuneOptions(engine=tmp_path, prompt_set="mt-bench", calibration=8, evaluation=8), None,
                          show=lambda line: None)[2]
    assert eight["evaluation_categories"] == eight["calibration_categories"] == dict.fromkeys(
        PROMPT_SETS["mt-bench"].categories, 1)
    assert "note" not in eight


@pytest.fixture(scope="module")
def tuned(engine, prompt_file, tmp_path_factory):
    """One `trtspec tune --write-recipe` run: (its report, the recipe it wrote)."""
    out = tmp_path_factory.mktemp("tuned") / "tuned.yaml"
    result = CliRunner().invoke(cli, ["tune", str(engine), "--prompt-set", str(prompt_file), "--calibration", "3",
                                      "--evaluation", "2", "--max-tokens", "24", "--budget", "2,4,16", "--threads", "1",
                                      "--no-progress", "--json", "--write-recipe", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout), out


def test_tune_predicts_measures_and_writes_the_winner(engine, tuned, tmp_path):
    report, out = tuned
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
    # the step model: the curve after the calibration's shortest, median and longest contexts; each measured run
    # priced on its own steps beside its measured step time
    model = report["step_model"]
    assert model["scale"] > 0 and len(model["measured_ms"]) == len(model["pasts"]) >= 2
    assert model["acceptance_ms"][0] == 0 and model["profiles"][0] == 1
    assert all(s["measured"]["modelled_ms_per_step"] > 0 for s in measured)
    assert report["winner"]["name"] in report["measured"]
    # every replayed setting carries the range a measurement on that many prompts would scatter over
    for s in report["settings"][1:]:
        lo, hi = s["predicted"]["speedup_range"]
        assert 0 < lo <= hi
    assert all(isinstance(s["measured"]["within_range"], bool) for s in measured if s["name"] != "none")
    # the winner as a complete recipe, from the engine's manifest and checkpoint record, that `recipe run` accepts
    recipe = load_recipe(out)
    winner = report["winner"]
    assert recipe.base.path == str(engine.parent / "base") and recipe.build.max_input_len == 96
    if winner["method"] != "none":
        assert recipe.deploy.method == winner["method"] and recipe.methods == [winner["method"]]
    dry = CliRunner().invoke(cli, ["recipe", "run", str(out), "--dry-run", "--workdir", str(tmp_path / "w")])
    assert dry.exit_code == 0, dry.output
    assert "trtspec build" in dry.output and "trtspec bench run" in dry.output
    assert out.read_text().startswith(f"# trtspec tune's winner: {winner['name']}")


def _with_winner(tuned, name: str) -> dict:
    """The tune run's report as if `name` had won."""
    report = copy.deepcopy(tuned[0])
    setting = next(s for s in report["settings"] if s["name"] == name)
    setting["measured"] = setting["measured"] or {"decode_tokens_per_s": 1.0, "tau": 1.0, "speedup": 1.0}
    report["winner"] = setting
    return report


@pytest.mark.parametrize("name, method, k", [("ngram/4", "ngram", 4), ("suffix/2", "suffix", 2)])
def test_a_training_free_winner_redeploys_the_tuned_engine_with_its_budget(tuned, engine, name, method, k, tmp_path):
    """From the engine itself (a Medusa one): its drafter and build are kept, so `recipe run` rebuilds nothing; the
    deployment runs the method with the winner's node budget (deploy --draft-budget, bench --draft-budget)."""
    from trtspec.engine.manifest import read_manifest

    out = tmp_path / "r.yaml"
    write_winner_recipe(_with_winner(tuned, name), out)
    recipe = load_recipe(out)
    assert read_manifest(engine).profile.max_draft_len > k  # the engine has room for more than the budget
    assert recipe.drafter.kind.value == "medusa" and recipe.deploy.draft_budget == k
    assert recipe.deploy.method == method and recipe.methods == [method]
    dry = CliRunner().invoke(cli, ["recipe", "run", str(out), "--dry-run", "--workdir", str(tmp_path / "w")])
    assert dry.exit_code == 0, dry.output
    assert f"--method {method} --draft-budget {k}" in dry.output and "--no-spec" not in dry.output
    assert f"--method {method} --limit" in dry.output and f"--draft-budget {k} --out" in dry.output  # the bench


def test_the_winner_goes_into_an_existing_recipe(tuned, tmp_path):
    """FILE a recipe already (the shipped tiny-medusa): its base, serve and bench sets kept; the winner's settings
    replace the drafter's; the baseline measured with another setting loses its figures."""
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[2] / "recipes" / "tiny-medusa.yaml"
    out = tmp_path / "tiny-medusa.yaml"
    out.write_text(shipped.read_text())
    write_winner_recipe(_with_winner(tuned, "ngram/4"), out)
    recipe = load_recipe(out)
    assert recipe.base.tiny == {} and recipe.serve is not None and recipe.bench.prompt_sets == ["mt-bench"]
    assert recipe.drafter.kind.value == "none" and recipe.build.max_draft_len == 4 and recipe.methods == ["ngram"]
    assert recipe.baseline.method == "ngram" and recipe.baseline.figures == {} and recipe.baseline.verify_curve is None
    # a Medusa tree winner, through --recipe (the template is left alone)
    tree = _with_winner(tuned, "medusa (shipped)")
    tree["winner"]["choices"] = [[0], [1], [0, 0]]
    written = tmp_path / "tree.yaml"
    write_winner_recipe(tree, written, template=shipped)
    recipe = load_recipe(written)
    assert recipe.drafter.kind.value == "medusa" and json.loads(recipe.build.choices) == [[0], [1], [0, 0]]
    assert recipe.build.preset is None and recipe.methods == ["medusa"]
    assert load_recipe(shipped).build.choices is None
    # plain decoding wins: speculation off where it is served, the bench stage still measures the best drafter
    plain = _with_winner(tuned, "none")
    write_winner_recipe(plain, out)
    recipe = load_recipe(out)
    assert recipe.deploy.method == "none" and recipe.methods and recipe.methods[0] != "none"
    dry = CliRunner().invoke(cli, ["recipe", "run", str(out), "--dry-run", "--workdir", str(tmp_path / "w")])
    assert dry.exit_code == 0, dry.output


def test_write_recipe_refuses_what_it_cannot_write_before_tuning(engine, tmp_path):
    not_a_recipe = tmp_path / "x.yaml"
    not_a_recipe.write_text("hello: 1\n")
    result = CliRunner().invoke(cli, ["tune", str(engine), "--write-recipe", str(not_a_recipe)])
    assert result.exit_code != 0 and "not a recipe to write the winner into" in result.output
    result = CliRunner().invoke(cli, ["tune", str(engine), "--recipe", str(not_a_recipe)])
    assert result.exit_code != 0 and "pass --write-recipe too" in result.output


def test_tune_errors(engine, prompt_file):
    with pytest.raises(ConfigError, match="--budget"):
        TuneOptions(engine=engine, budgets=(0,))
    with pytest.raises(ConfigError, match="calibration"):
        run_tune(TuneOptions(engine=engine, prompt_set=str(prompt_file), evaluation=6, calibration=1,
                             show_progress=False), show=lambda line: None)


def _fitted_eagle_engine(root):
    """A tiny engine whose EAGLE-1 draft predicts the target: a random tiny draft whose layer is silenced (its
    attention and MLP outputs zero: the residual passes fc's output on) and whose fc is the least-squares map from
    (token t + 1's embedding, the target's feature at t) to the target's feature at t + 1, fitted on the target's
    greedy outputs from random prompts. A random draft is almost never accepted; this one is, at several depths."""
    import torch
    from safetensors.numpy import load_file

    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing import TinyModel, write_eagle_draft

    build_options = dict(max_input_len=96, max_seq_len=192, max_batch_size=2, max_draft_len=8,
                         choices="[[0],[1],[0,0]]")
    target = LocalGenerator(tiny_engine(root, drafter="eagle", **build_options), threads=1)
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, target.engine.vocab_size, size=rng.integers(4, 12)).tolist() for _ in range(24)]
    embed = load_file(str(root / "base" / "model.safetensors"))["model.embed_tokens.weight"]
    inputs, outputs = [], []
    for r in eagle_tree.record_features(target, prompts, 48):
        tokens = r.prompt_ids + r.output_ids
        for t in range(len(r.features) - 1):
            inputs.append(np.concatenate([embed[tokens[t + 1]], r.features[t], [1.0]]))
            outputs.append(r.features[t + 1])
    fit = np.linalg.lstsq(np.array(inputs), np.array(outputs), rcond=None)[0]  # [2H + 1, H]
    draft = write_eagle_draft(root / "eagle-fitted", TinyModel(vocab_size=target.engine.vocab_size),
                              embed_tokens=False)
    state = torch.load(draft / "pytorch_model.bin")
    state["fc.weight"] = torch.tensor(fit[:-1].T.copy(), dtype=state["fc.weight"].dtype)
    state["fc.bias"] = torch.tensor(fit[-1].copy(), dtype=state["fc.bias"].dtype)
    state["layers.0.self_attn.o_proj.weight"].zero_()
    state["layers.0.mlp.down_proj.weight"].zero_()
    torch.save(state, draft / "pytorch_model.bin")
    convert(ConvertOptions(base=root / "base", out=root / "ckpt-fitted", eagle=draft), show_progress=False)
    build(BuildOptions(source=root / "ckpt-fitted", out=root / "engine-fitted", tokenizer=root / "tokenizer",
                       **build_options))
    return root / "engine-fitted"


@pytest.fixture(scope="module")
def eagle_engine(tmp_path_factory):
    return _fitted_eagle_engine(tmp_path_factory.mktemp("tune-eagle"))


@pytest.fixture(scope="module")
def eagle_recordings(eagle_engine):
    """(generator, prompts, recordings with the draft's ranks 8 deep)."""
    generator = LocalGenerator(eagle_engine, threads=1)
    prompts = [generator.encode(t) for t in TEXTS]
    recordings = eagle_tree.record_features(generator, prompts, MAX_TOKENS + generator.engine.max_draft_len)
    for r in recordings:
        eagle_tree.teacher_force(generator.engine, r, 8, MAX_TOKENS)
    return generator, prompts, recordings


def _eagle_run(generator, prompts, choices) -> SpecStats:
    real = SpecStats()
    for ids in prompts:
        real = real.merge(generate(generator.engine, ids, make_proposer("eagle", generator.engine,
                                                                         tree=build_tree(choices), backoff=False),
                                   GenerationConfig(max_tokens=MAX_TOKENS,
                                                    end_id=generator.manifest.model.end_id)).stats)
    return real


def test_eagle_recording_ranks_the_true_tokens(eagle_recordings):
    """Depth 1's rank is the last committed entry's, as the runtime drafts the root's children; deeper ranks stop
    after a depth whose true token left the candidates kept; rows past a run's roots are never drafted."""
    generator, prompts, recordings = eagle_recordings
    for r in recordings:
        ranks, n = r.head_ranks, eagle_tree.roots(r, MAX_TOKENS)
        assert ranks.shape == (len(r.output_ids), 8) and (ranks[n:] == eagle_tree.HEAD_RANKS).all()
        missed = ranks[:, :-1] >= eagle_tree.HEAD_RANKS
        assert (ranks[:, 1:][missed] == eagle_tree.HEAD_RANKS).all()
    # the fitted draft is accepted often, at several depths: the replay test below is not about zeros
    probabilities = eagle_tree.node_probabilities(recordings, MAX_TOKENS)
    assert probabilities[(0,)] > 0.3 and probabilities[(0, 0)] > 0.1 and probabilities[(0, 0, 0)] > 0.03


@pytest.mark.parametrize("choices", [[[0]], [[0], [1], [0, 0]], [[0], [1], [2], [3], [0, 0], [0, 1]],
                                     [[0], [0, 0], [0, 0, 0], [0, 0, 0, 0]], "greedy/8"])
def test_eagle_tree_replay_reproduces_a_real_run(eagle_recordings, choices):
    """A static EAGLE tree walked over the teacher-forced ranks: the real run's steps, accepted tokens and
    per-depth acceptance, at T = 0."""
    generator, prompts, recordings = eagle_recordings
    if choices == "greedy/8":
        choices = greedy_tree(eagle_tree.depth_accuracies(recordings, MAX_TOKENS, 8), 8)[0]
        assert len(choices) == 8 and max(len(c) for c in choices) >= 3
    real = _eagle_run(generator, prompts, choices)
    replayed = replay_tree(recordings, choices, MAX_TOKENS, generator.engine.step_costs())
    assert (replayed.steps, replayed.accepted_tokens, replayed.draft_tokens) == \
        (real.steps, real.accepted_tokens, real.draft_tokens)
    assert replayed.position_hits == real.position_hits and replayed.profile_steps == real.profile_steps
    assert real.accepted_tokens > 0


def test_eagle_ranks_give_depth_accuracies_and_node_probabilities():
    """Depth d's accuracies count the roots whose depths before d were all among the candidates kept (the path so far
    accepted); a node's probability, the roots whose ranks begin with its path."""
    from trtspec.tune.replay import Recording

    ranks = np.array([[0, 0, 10], [0, 1, 0], [1, 0, 10], [0, 10, 10], [2, 10, 10], [10, 10, 10], [0, 0, 1],
                      [10, 10, 10]])  # the last row: the final token, no root
    recording = Recording([1], list(range(8)), np.zeros((8, 1)), ranks)
    a = eagle_tree.depth_accuracies([recording], max_tokens=8, depth=3)
    assert a[0][:3] == pytest.approx([4 / 7, 1 / 7, 1 / 7]) and sum(a[0]) == pytest.approx(6 / 7)
    assert a[1][:2] == pytest.approx([3 / 6, 1 / 6])  # 6 roots reached depth 2; 2 of them missed it
    assert a[2][:2] == pytest.approx([1 / 4, 1 / 4])
    p = eagle_tree.node_probabilities([recording], max_tokens=8)
    assert p == pytest.approx({(0,): 4 / 7, (0, 0): 2 / 7, (0, 1): 1 / 7, (0, 1, 0): 1 / 7, (0, 0, 1): 1 / 7,
                               (1,): 1 / 7, (1, 0): 1 / 7, (2,): 1 / 7})
    assert eagle_tree.expected_length(p, [[0], [0, 0], [3]]) == pytest.approx(1 + 6 / 7)
    assert greedy_tree(a, 3)[0] == [[0], [0, 0], [1]]  # 4/7, then 4/7 * 3/6 = 2/7, then [1] at 1/7


def test_tune_builds_and_measures_eagle_trees(eagle_engine, prompt_file, tmp_path):
    """On an EAGLE-1 engine tune replays the greedy tree of each budget and the shipped tree over the draft's ranks,
    measures the best beside the shipped tree, and the replay over the evaluation prompts is the measured run; an
    EAGLE tree winner is written with the drafter's depth."""
    out = tmp_path / "tuned.yaml"
    result = CliRunner().invoke(cli, ["tune", str(eagle_engine), "--prompt-set", str(prompt_file), "--calibration",
                                      "4", "--evaluation", "2", "--max-tokens", "24", "--budget", "2,4",
                                      "--threads", "1", "--no-progress", "--json", "--write-recipe", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    names = [s["name"] for s in report["settings"]]
    assert "eagle (shipped)" in names and any(n.startswith("eagle-tree/") for n in names)
    assert report["eagle_depth"] == 4 and report["eagle_node_probabilities"][0][0] == [0]
    measured = {s["name"]: s for s in report["settings"] if s["measured"] is not None}
    assert "eagle (shipped)" in measured and any(n.startswith("eagle-tree/") for n in measured)
    for s in measured.values():
        assert s["measured"]["identical"] == "2/2"
        assert s["measured"]["replayed_tau"] == s["measured"]["tau"], s["name"]
    shipped = measured["eagle (shipped)"]
    assert shipped["choices"] == [[0], [1], [0, 0]] and shipped["predicted"]["draft_ms_per_step"] > 0
    assert shipped["predicted"]["expected_tau_per_root"] > 1
    # an EAGLE tree as the winner: build.choices, K its nodes at least, the drafter as deep as the tree
    tree = _with_winner((report, out), "eagle (shipped)")
    tree["winner"]["choices"] = [[0], [1], [2], [0, 0], [0, 0, 0]]
    written = tmp_path / "tree.yaml"
    write_winner_recipe(tree, written)
    recipe = load_recipe(written)
    assert recipe.drafter.kind.value == "eagle" and json.loads(recipe.build.choices) == tree["winner"]["choices"]
    assert recipe.drafter.num_eagle_layers == 3 and recipe.drafter.max_non_leaves_per_layer == 1
    assert recipe.build.max_draft_len == 8 and recipe.deploy.method == "eagle" and recipe.methods == ["eagle"]
    dry = CliRunner().invoke(cli, ["recipe", "run", str(written), "--dry-run", "--workdir", str(tmp_path / "w")])
    assert dry.exit_code == 0, dry.output
    assert "--num-eagle-layers 3 --max-non-leaves-per-layer 1" in dry.output


def test_a_quantized_medusa_engine_is_tuned_over_chains(generator, recordings):
    """A quantized engine with GroupQueryAttention drafts chains only, so tune predicts chains for it: each budget's
    top-1 chain and the shipped tree's chain, never a tree it would not draft."""
    from dataclasses import replace

    from trtspec.tune.tuner import _medusa_trees
    from trtspec.engine.manifest import EngineWeights, WeightFormat
    from trtspec.model.quantize import WeightDtype

    manifest = generator.manifest
    _, trees = _medusa_trees(recordings[1], [2, 3, 8], manifest)
    assert any(c[-1] != 0 for _, choices in trees for c in choices)  # fp32: real trees, with second choices
    int8 = WeightFormat(dtype=WeightDtype.INT8, block_size=32, accuracy_level=4)
    quantized = replace(manifest, weights=EngineWeights(linear=int8, lm_head=int8, embedding=int8), attention="gqa")
    _, trees = _medusa_trees(recordings[1], [2, 3, 8], quantized)
    chains = dict(trees)
    assert all(c == [[0] * d for d in range(1, len(c) + 1)] for c in chains.values())
    assert chains["medusa-tree/2"] == [[0], [0, 0]] and chains["medusa (shipped)"] == [[0], [0, 0], [0, 0, 0]]


def test_an_eagle2_engines_dynamic_tree_is_run_on_the_calibration_prompts(prompt_file, tmp_path_factory):
    """EAGLE-2's tree depends on the draft's scores at every step: not replayed, run for real and measured."""
    from trtspec.speculative.tree import DynamicTree

    engine = tiny_engine(tmp_path_factory.mktemp("tune-eagle2"), drafter="eagle", max_input_len=96, max_seq_len=192,
                         max_batch_size=2, max_draft_len=4, dynamic_tree=DynamicTree(depth=2, top_k=2, total_tokens=4))
    report = run_tune(TuneOptions(engine=engine, prompt_set=str(prompt_file), calibration=2, evaluation=1,
                                  max_tokens=16, budgets=(4,), threads=1, show_progress=False), show=lambda line: None)
    eagle2 = next(s for s in report["settings"] if s["name"] == "eagle2 (shipped)")
    assert eagle2["predicted"]["calibration"] == "run, not replayed" and eagle2["predicted"]["per_position_acceptance"]
    assert eagle2["measured"]["identical"] == "1/1" and eagle2["measured"]["replayed_tau"] is None
    assert report["eagle_depth"] is None and not any(s["name"].startswith("eagle-tree/") for s in report["settings"])


def test_a_quantized_eagle_engine_is_tuned_over_chains(eagle_recordings):
    """As for Medusa: a quantized engine drafts chains only, so tune predicts each budget's top-1 chain (as deep as
    the draft was forced) and the shipped tree's chain."""
    from dataclasses import replace

    from trtspec.tune.tuner import _eagle_trees
    from trtspec.engine.manifest import EngineWeights, WeightFormat
    from trtspec.model.quantize import WeightDtype

    generator, _, recordings = eagle_recordings
    manifest = generator.manifest
    _, trees = _eagle_trees(recordings, [2, 8], manifest, MAX_TOKENS, depth=8)
    assert any(c[-1] != 0 for _, choices in trees for c in choices)  # fp32: real trees, with second choices
    int8 = WeightFormat(dtype=WeightDtype.INT8, block_size=32, accuracy_level=4)
    quantized = replace(manifest, weights=EngineWeights(linear=int8, lm_head=int8, embedding=int8), attention="gqa")
    chains = dict(_eagle_trees(recordings, [2, 8], quantized, MAX_TOKENS, depth=3)[1])
    assert chains == {"eagle-tree/2": [[0], [0, 0]], "eagle-tree/3": [[0], [0, 0], [0, 0, 0]],
                      "eagle (shipped)": [[0], [0, 0]]}


@pytest.mark.slow
def test_eagle_tree_replay_reproduces_real_runs_of_the_shipped_smollm2_draft(tmp_path):
    """SmolLM2-135M with the EAGLE draft trained here (recipes/assets), K = 16: the replayed steps and accepted
    tokens of the shipped tree and of the greedy trees equal real runs' on MT-Bench prompts."""
    from pathlib import Path

    from trtspec import ConvertOptions, convert
    from trtspec.bench.workload import load_bench_prompts
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.hub.fetch import fetch_model

    draft = Path(__file__).resolve().parents[2] / "recipes" / "assets" / "smollm2-135m-eagle"
    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt", eagle=draft, num_eagle_layers=1,
                           max_non_leaves_per_layer=1), show_progress=False)
    build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / "engine", choices="[[0]]", max_draft_len=16,
                       max_input_len=512, max_seq_len=768))
    generator = LocalGenerator(tmp_path / "engine", threads=2)
    prompts = [list(p.ids) for p in load_bench_prompts("mt-bench", limit=3, split=None, generator=generator,
                                                        max_tokens=MAX_TOKENS, show=lambda line: None)]
    recordings = eagle_tree.record_features(generator, prompts, MAX_TOKENS + 16)
    for r in recordings:
        eagle_tree.teacher_force(generator.engine, r, 8, MAX_TOKENS)
    accuracies = eagle_tree.depth_accuracies(recordings, MAX_TOKENS, 8)
    for choices in ([[0]], greedy_tree(accuracies, 4)[0], greedy_tree(accuracies, 16)[0]):
        real = _eagle_run(generator, prompts, choices)
        replayed = replay_tree(recordings, choices, MAX_TOKENS, generator.engine.step_costs())
        assert (replayed.steps, replayed.accepted_tokens) == (real.steps, real.accepted_tokens), choices
        assert real.accepted_tokens > 0


def test_speedup_range_is_what_a_few_prompts_drawn_like_the_calibration_ones_would_show():
    from trtspec.tune.tuner import speedup_range

    # prompts alike: the range is the point; plain 10 ms a token, these 5 ms a token: 2x
    assert speedup_range([(100, 500.0)] * 6, 10.0, 4) == [2.0, 2.0]
    # prompts that differ (1x and 3x): a few of them scatter widely, many less, always around the pooled figure
    mixed = [(100, 1000.0), (100, 1000.0 / 3)] * 3
    few, many = speedup_range(mixed, 10.0, 2), speedup_range(mixed, 10.0, 64)
    assert few[0] < many[0] <= 1.5 <= many[1] < few[1] and 1.0 <= few[0] and few[1] <= 3.0
    assert speedup_range([], 10.0, 4) is None and speedup_range(mixed, 10.0, 0) is None


def test_the_table_says_where_each_measurement_fell_in_its_predicted_range(tuned):
    from trtspec.tune.tuner import format_tune

    report = tuned[0]
    lines = format_tune(report)
    measured = [s for s in report["settings"] if s["measured"] is not None and s["predicted"].get("speedup_range")]
    for s in measured:
        (line,) = [x for x in lines if x.startswith(f"{s['name']}: predicted ")]
        assert "2 prompts drawn like the calibration ones" in line
        assert line.endswith("(inside)" if s["measured"]["within_range"] else "(outside)")
