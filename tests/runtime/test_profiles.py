"""Slot profiles: the manifest's list, the profile each step runs, padding within it, batches of mixed drafts,
and the verify curve cached beside the engine."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.manifest import Manifest, Profile, default_slot_profiles, parse_slot_profiles, read_manifest
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime import verify_curve
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.tree import build_tree, chain_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64)
K = 8


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    ckpt = tiny_trtllm_checkpoints(root, MODEL, ("none",))["none"]
    for name, extra in (("default", {}), ("one", {"profiles": "9"}), ("some", {"profiles": "2,4"})):
        build(BuildOptions(source=ckpt, out=root / name, max_draft_len=K, max_input_len=48, max_seq_len=128, **extra))
    return root, ckpt


# ---- the list ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("k,profiles", [(0, ()), (1, (2,)), (2, (2, 3)), (4, (2, 3, 5)), (6, (2, 3, 5, 7)),
                                        (16, (2, 3, 5, 9, 17)), (20, (2, 3, 5, 9, 17, 21))])
def test_default_profiles_double_the_draft_up_to_k_plus_one(k, profiles):
    assert default_slot_profiles(k) == profiles


def test_chosen_profiles_always_end_with_k_plus_one():
    assert parse_slot_profiles("2,4,8", 16) == (2, 4, 8, 17)
    assert parse_slot_profiles("3,17", 16) == (3, 17)


@pytest.mark.parametrize("text,message", [
    ("4,2", "--profiles 4,2: slot counts must increase (2 after 4)"),
    ("2,2", "--profiles 2,2: slot counts must increase (2 after 2)"),
    ("2,18", "--profiles 2,18: 18 slots is above max_draft_len + 1 = 17"),
    ("1,4", "--profiles 1,4: a profile of 1 slot(s) is below 2"),
    ("2,x", "--profiles 2,x: expected slot counts separated by commas"),
    ("", "--profiles : expected slot counts separated by commas"),
])
def test_bad_profiles_are_one_line_naming_the_value(text, message):
    with pytest.raises(ConfigError) as error:
        parse_slot_profiles(text, 16)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_build_cli_rejects_bad_profiles_before_writing(built, tmp_path):
    _, ckpt = built
    out = tmp_path / "engine"
    result = CliRunner().invoke(cli, ["build", str(ckpt), "--out", str(out), "--max-draft-len", "8", "--max-input-len",
                                      "48", "--max-seq-len", "128",
                                      "--profiles", "5,3"])
    assert result.exit_code != 0 and "--profiles 5,3: slot counts must increase (3 after 5)" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_manifest_lists_profiles(built):
    root, _ = built
    assert read_manifest(root / "default").profile.slots == (2, 3, 5, 9)
    assert read_manifest(root / "one").profile.slots == (9,)
    assert read_manifest(root / "some").profile.slots == (2, 4, 9)
    m = read_manifest(root / "default")
    assert Manifest.from_dict(m.to_dict()) == m
    one = Profile(max_batch_size=1, max_input_len=8, max_seq_len=32, max_draft_len=4, slot_profiles=(5,))
    assert one.slots == (5,) and one.profile_for(2) == 5 and one.profile_for(1) == 1
    for profiles in ((2, 3), ()):
        with pytest.raises(ConfigError, match=rf"slot_profiles \[{', '.join(map(str, profiles))}\]: the last profile "
                                              r"must be max_draft_len \+ 1 = 5"):
            Profile(max_batch_size=1, max_input_len=8, max_seq_len=32, max_draft_len=4, slot_profiles=profiles)


def test_inspect_shows_the_profiles(built):
    root, _ = built
    result = CliRunner().invoke(cli, ["inspect", str(root / "some")])
    assert result.exit_code == 0 and "slot_profiles              2, 4, 9" in result.output
    as_json = json.loads(CliRunner().invoke(cli, ["inspect", str(root / "some"), "--json"]).output)
    assert as_json["slot_profiles"] == [2, 4, 9] and as_json["method"] == "none"
    assert as_json["methods"] == ["none", "ngram", "suffix", "lookahead"]  # K = 8, no drafter of its own


# ---- the step's profile and padding -------------------------------------------------------------------------

def _chain_step(engine, seq, n, rng):
    tree = chain_tree(n - 1)
    return engine.verify(seq, rng.integers(0, MODEL.vocab_size, n), tree.position_offsets, tree.mask)


def test_each_step_runs_the_smallest_profile_holding_its_draft(built):
    root, _ = built
    engine = OrtEngine(root / "default", threads=1)
    rng = np.random.default_rng(0)
    seq = engine.open()
    engine.prefill(seq, rng.integers(0, MODEL.vocab_size, 10))
    ran = {n: _chain_step(engine, seq, n, rng).slots for n in range(1, K + 2)}
    assert ran == {1: 1, 2: 2, 3: 3, 4: 5, 5: 5, 6: 9, 7: 9, 8: 9, 9: 9}


def test_logits_of_the_same_rows_agree_across_profiles(built):
    """The same tree step, run in the 3-slot profile of one engine and padded into 9 slots of another: equal within
    the build's numerics tolerance, on the real slots; committing and going on stays equal too."""
    root, _ = built
    small, padded = OrtEngine(root / "default", threads=1), OrtEngine(root / "one", threads=1)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, MODEL.vocab_size, 12)
    tree = build_tree([[0], [1]])
    tokens = rng.integers(0, MODEL.vocab_size, 3)
    outs = []
    for engine in (small, padded):
        seq = engine.open()
        engine.prefill(seq, prompt)
        first = engine.verify(seq, tokens, tree.position_offsets, tree.mask)
        engine.commit(seq, (0, 2))
        second = engine.verify(seq, tokens[:1], np.zeros(1, np.int64), np.ones((1, 1), bool))
        outs.append((first, second))
    assert (outs[0][0].slots, outs[1][0].slots) == (3, 9)
    for a, b in zip(*outs):
        scale = max(1.0, float(np.abs(b.logits).max()))
        assert np.abs(a.logits - b.logits).max() / scale < 1e-4
        assert np.abs(a.hidden - b.hidden).max() < 1e-4


def test_a_batch_of_mixed_drafts_runs_its_largest_drafts_profile(built):
    root, _ = built
    engine = OrtEngine(root / "default", threads=1)
    rng = np.random.default_rng(2)
    prompts = [rng.integers(0, MODEL.vocab_size, n) for n in (5, 9, 14)]
    sizes = (1, 3, 4)  # plain, a 2-token chain, a 3-token chain: the batch runs 5 slots
    drafts = [rng.integers(0, MODEL.vocab_size, n) for n in sizes]
    alone = []
    for prompt, tokens in zip(prompts, drafts):
        seq = engine.open()
        engine.prefill(seq, prompt)
        tree = chain_tree(len(tokens) - 1)
        alone.append(engine.verify(seq, tokens, tree.position_offsets, tree.mask))
        engine.close(seq)
    seqs = [engine.open() for _ in prompts]
    for seq, prompt in zip(seqs, prompts):
        engine.prefill(seq, prompt)
    items = [(seq, tokens, chain_tree(len(tokens) - 1).position_offsets, chain_tree(len(tokens) - 1).mask)
             for seq, tokens in zip(seqs, drafts)]
    batched = engine.verify_batch(items)
    assert [o.slots for o in batched] == [5, 5, 5] and [o.slots for o in alone] == [1, 3, 5]
    for a, b in zip(alone, batched):
        assert a.logits.shape == b.logits.shape and np.abs(a.logits - b.logits).max() < 1e-4
    plain = engine.verify_batch([(seq, tokens[:1], np.zeros(1, np.int64), np.ones((1, 1), bool))
                                 for seq, tokens in zip(seqs, drafts)])
    assert [o.slots for o in plain] == [1, 1, 1]


def test_speculation_is_lossless_in_any_profile_set_batch_1_and_8(built):
    root, _ = built
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, MODEL.vocab_size, int(rng.integers(2, 40))) for _ in range(8)]
    config = GenerationConfig(max_tokens=30)
    reference = None
    for name in ("default", "one", "some"):
        engine = OrtEngine(root / name, threads=1)
        plain = [generate(engine, p, make_proposer("none", engine), config).output_ids for p in prompts]
        alone = [generate(engine, p, make_proposer("ngram", engine), config) for p in prompts]
        batched = generate_batch(engine, [Request(p, make_proposer("ngram", engine), config) for p in prompts],
                                 max_batch_size=8)
        assert [r.output_ids for r in alone] == plain == [r.output_ids for r in batched], name
        reference = reference or plain
        assert plain == reference  # the same tokens whatever profiles the engine carries
        assert set().union(*(r.stats.profile_steps for r in alone)) <= {1, *engine.slot_profiles}


# ---- the verify curve ---------------------------------------------------------------------------------------

def test_verify_curve_is_measured_once_and_cached_beside_the_engine(built, tmp_path, monkeypatch):
    root, _ = built
    engine_dir = tmp_path / "engine"
    shutil.copytree(root / "default", engine_dir)
    (engine_dir / verify_curve.CURVE_FILE).unlink(missing_ok=True)  # measured by an earlier test
    costs = OrtEngine(engine_dir, threads=1).step_costs()
    assert costs.profiles == (1, 2, 3, 5, 9) and costs.relative[0] == 1.0
    assert list(costs.relative) == sorted(costs.relative)  # levelled: no profile costs more than a larger one
    (saved,) = json.loads((engine_dir / verify_curve.CURVE_FILE).read_text())["curves"]
    assert saved["slot_profiles"] == [2, 3, 5, 9] and saved["threads"] == 1

    def no_measuring(engine, **kwargs):
        raise AssertionError("measured again")

    real_measure = verify_curve.measure
    monkeypatch.setattr(verify_curve, "measure", no_measuring)
    assert OrtEngine(engine_dir, threads=1).step_costs() == costs  # read back, not measured
    with pytest.raises(AssertionError, match="measured again"):
        OrtEngine(engine_dir, threads=2).step_costs()  # another thread count is another curve
    monkeypatch.setattr(verify_curve, "measure", real_measure)
    other = OrtEngine(engine_dir, threads=1, spin=not OrtEngine(engine_dir, threads=1).spin).step_costs()
    monkeypatch.setattr(verify_curve, "measure", no_measuring)
    # both settings kept: measuring one does not measure the other's curve away
    assert OrtEngine(engine_dir, threads=1).step_costs() == costs
    assert OrtEngine(engine_dir, threads=1, spin=not OrtEngine(engine_dir, threads=1).spin).step_costs() == other
    assert len(json.loads((engine_dir / verify_curve.CURVE_FILE).read_text())["curves"]) == 2
    from trtspec.engine.summary import engine_summary

    summary = engine_summary(engine_dir)  # inspect: the most recent curve and its setting
    assert summary["verify_curve_measured"].startswith("threads 1, ") and set(summary["verify_curve"]) == {
        "1", "2", "3", "5", "9"}


@pytest.mark.parametrize("text", ['{"profiles": [1, 2], "relative": [1.0, 1.1]}', '{"curves": 3}', "[]", "{"])
def test_a_curve_file_without_a_list_of_curves_holds_none(tmp_path, text):
    """Such a file is measured again (and rewritten) rather than read."""
    path = tmp_path / verify_curve.CURVE_FILE
    path.write_text(text)
    assert verify_curve.read_curves(path) == []


def test_a_read_only_engine_keeps_its_curve_in_memory(built, tmp_path, monkeypatch):
    root, _ = built
    engine_dir = tmp_path / "ro"
    shutil.copytree(root / "default", engine_dir)
    (engine_dir / verify_curve.CURVE_FILE).unlink(missing_ok=True)

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(verify_curve.tempfile, "mkstemp", read_only)  # (chmod does not stop root)
    costs = OrtEngine(engine_dir, threads=1).step_costs()
    assert costs.profiles == (1, 2, 3, 5, 9) and not (engine_dir / verify_curve.CURVE_FILE).exists()
