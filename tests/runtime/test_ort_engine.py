"""The ONNX Runtime engine: same numbers as the torch reference, lossless speculation, clear limits."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from trtspec.engine.manifest import ONNX_GRAPH_FORMAT
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import BuildError, RuntimeEngineError
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.model.torch_engine import TorchEngine
from trtspec.speculative.tree import DynamicTree
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.sampling import SamplingParams
from trtspec.speculative.tree import build_tree
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64)
TREE = "[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0],[0,0,1]]"


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    root = tmp_path_factory.mktemp("ort")
    ckpts = tiny_trtllm_checkpoints(root, MODEL, ("medusa", "eagle"))
    out = {}
    for name, ckpt, extra in (("medusa", ckpts["medusa"], {"choices": TREE, "max_draft_len": 10}),
                              ("eagle", ckpts["eagle"], {"choices": TREE}),
                              ("eagle2", ckpts["eagle"], {"dynamic_tree": DynamicTree(depth=3, top_k=3, total_tokens=8)})):
        build(BuildOptions(source=ckpt, out=root / f"engine-{name}", max_input_len=64, max_seq_len=160, **extra))
        out[name] = (OrtEngine(root / f"engine-{name}", threads=1), TorchEngine.from_checkpoint(ckpt))
    return out


def _prompts(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, MODEL.vocab_size, size=int(rng.integers(1, 48))) for _ in range(n)]


def _proposer(name, engine, no_spec=False, backoff=False):
    """The method's full tree every step (backoff False: the random drafters' trees would rest), or backed off."""
    if no_spec:
        return make_proposer("none", engine)
    if name == "eagle2":
        return make_proposer("eagle2", engine, dynamic=DynamicTree(depth=3, top_k=3, total_tokens=8), backoff=backoff)
    return make_proposer(name, engine, tree=build_tree(eval(TREE)), backoff=backoff)


@pytest.mark.parametrize("name", ["medusa", "eagle", "eagle2"])
def test_ort_engine_matches_torch_reference_step_by_step(engines, name):
    ort_engine, torch_engine = engines[name]
    for prompt in _prompts(3):
        outs = [generate(e, prompt, _proposer(name, e), GenerationConfig(max_tokens=24)) for e in engines[name]]
        assert outs[0].output_ids == outs[1].output_ids
        ort_stats, torch_stats = (o.stats.to_dict() for o in outs)
        # the ORT engine pads to its slot profiles (K = 8: 2, 3, 5, 9); the reference runs exact slots, unreported
        assert set(ort_stats.pop("steps_per_profile")) <= {"2", "3", "5", "9"}
        assert torch_stats.pop("steps_per_profile") == {}
        assert ort_stats == torch_stats


@pytest.mark.parametrize("backoff", [False, True])
@pytest.mark.parametrize("name", ["medusa", "eagle", "eagle2"])
def test_speculative_equals_no_spec_on_the_same_engine(engines, name, backoff):
    engine = engines[name][0]
    rng = np.random.default_rng(1)
    for prompt in _prompts(50, seed=2):
        max_tokens = int(rng.integers(1, 40))
        plain = generate(engine, prompt, _proposer(name, engine, no_spec=True), GenerationConfig(max_tokens=max_tokens))
        end_id = plain.output_ids[-1] if rng.random() < 0.3 else None
        config = GenerationConfig(max_tokens=max_tokens, end_id=end_id)
        plain = generate(engine, prompt, _proposer(name, engine, no_spec=True), config)
        spec = generate(engine, prompt, _proposer(name, engine, backoff=backoff), config)
        assert spec.output_ids == plain.output_ids and spec.finish_reason == plain.finish_reason


def test_sampling_matches_torch_reference_with_the_same_seed(engines):
    ort_engine, torch_engine = engines["medusa"]
    config = GenerationConfig(max_tokens=20, sampling=SamplingParams(temperature=0.8, seed=5))
    outs = [generate(e, _prompts(1)[0], _proposer("medusa", e), config).output_ids for e in (ort_engine, torch_engine)]
    assert outs[0] == outs[1]


def test_engine_of_an_older_graph_format_is_refused_in_one_line(engines, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(engines["medusa"][0].engine_dir, old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["graph_format"] = ONNX_GRAPH_FORMAT - 1
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BuildError) as error:
        OrtEngine(old, threads=1)
    assert "\n" not in str(error.value) and str(error.value).endswith(
        f"ONNX graphs are of format {ONNX_GRAPH_FORMAT - 1}, this trtspec runs format {ONNX_GRAPH_FORMAT}; rebuild "
        "the engine with this trtspec (`trtspec build ... --force`)")


def test_limits_are_clear_errors(engines):
    engine = engines["medusa"][0]
    with pytest.raises(RuntimeEngineError, match="prompt of 65 tokens; the engine takes 1..64"):
        generate(engine, np.zeros(65, np.int64), _proposer("medusa", engine), GenerationConfig(max_tokens=4))
    with pytest.raises(RuntimeEngineError, match="max_seq_len is 160"):
        generate(engine, np.zeros(60, np.int64), _proposer("medusa", engine), GenerationConfig(max_tokens=200))


@pytest.mark.parametrize("name", ["medusa", "eagle", "eagle2"])
def test_in_flight_batch_equals_each_sequence_alone(engines, name):
    """8 prompts of different lengths, speculation on and off mixed, max_tokens and trees differing per
    request, 3 at a time: sequences join as others leave, and every output equals its run alone."""
    engine = engines[name][0]
    rng = np.random.default_rng(7)
    prompts = _prompts(8, seed=9)
    configs = [GenerationConfig(max_tokens=int(rng.integers(4, 30))) for _ in prompts]
    no_spec = [i % 3 == 2 for i in range(len(prompts))]
    alone = [generate(engine, p, _proposer(name, engine, s), c).output_ids
             for p, c, s in zip(prompts, configs, no_spec)]
    requests = [Request(p, _proposer(name, engine, s), c) for p, c, s in zip(prompts, configs, no_spec)]
    calls, extends, heads = [], [], []
    verify_batch, draft_extend_batch = engine.verify_batch, engine.draft_extend_batch
    medusa_logits_batch = engine.medusa_logits_batch
    engine.verify_batch = lambda items: (calls.append(len(items)), verify_batch(items))[1]
    engine.draft_extend_batch = lambda items: (extends.append(len(items)), draft_extend_batch(items))[1]
    engine.medusa_logits_batch = lambda hidden: (heads.append(len(hidden)), medusa_logits_batch(hidden))[1]
    try:
        batched = generate_batch(engine, requests, max_batch_size=3)
    finally:
        del engine.verify_batch, engine.draft_extend_batch, engine.medusa_logits_batch
    assert [r.output_ids for r in batched] == alone
    assert max(calls) == 3 and len(engine._seqs) == 0  # batched steps happened; every sequence was closed
    # drafters observe each step together: one draft run extends every speculating sequence's EAGLE draft cache,
    # one run of the Medusa heads scores every speculating sequence's last accepted hidden state
    assert (max(extends, default=0) >= 2) == name.startswith("eagle")
    assert (max(heads, default=0) >= 2) == (name == "medusa")
    # sequences left in every order, yet each batch ran in the pool's rows in place, never through a staging copy
    assert engine._rows == [] and engine._staging == {}
    # backed off, drafters rest and look again at different steps of different rows (deferred entries caught up)
    requests = [Request(p, _proposer(name, engine, s, backoff=True), c) for p, c, s in zip(prompts, configs, no_spec)]
    assert [r.output_ids for r in generate_batch(engine, requests, max_batch_size=3)] == alone


@pytest.mark.parametrize("name", ["medusa", "eagle"])
def test_sequences_beyond_the_pool_rows_still_batch_losslessly(tmp_path, name):
    """An engine with max_batch_size 2 driven 4 at a time: two sequences have caches of their own, so batches
    go through the staging copy; a closing row's sequence moves into the freed row (with its draft cache);
    outputs equal runs alone."""
    ckpt = tiny_trtllm_checkpoints(tmp_path, MODEL, (name,))[name]
    build(BuildOptions(source=ckpt, out=tmp_path / "engine", max_input_len=64, max_seq_len=160, max_batch_size=2,
                       choices=TREE, max_draft_len=10))
    engine = OrtEngine(tmp_path / "engine", threads=1)
    prompts, configs = _prompts(6, seed=3), [GenerationConfig(max_tokens=n) for n in (5, 29, 11, 23, 17, 8)]
    alone = [generate(engine, p, _proposer(name, engine), c).output_ids for p, c in zip(prompts, configs)]
    requests = [Request(p, _proposer(name, engine), c) for p, c in zip(prompts, configs)]
    assert [r.output_ids for r in generate_batch(engine, requests, max_batch_size=4)] == alone
    assert 4 in engine._staging and engine._rows == [] and engine._seqs == {}


def test_draft_extend_batch_equals_one_extension_per_sequence(engines):
    """Ragged entries (1, 4 and 2 of them) after different pasts: one padded batched run gives each sequence the
    hidden states and logits (and later draft steps) its own extension gives."""
    alone, together = (OrtEngine(engines["eagle"][0].engine_dir, threads=1) for _ in range(2))
    rng = np.random.default_rng(4)
    prompts, entries = _prompts(3, seed=5), (1, 4, 2)
    feats = [rng.standard_normal((len(p), MODEL.hidden_size)).astype(np.float32) for p in prompts]
    new = [(rng.integers(0, MODEL.vocab_size, n), rng.standard_normal((n, MODEL.hidden_size)).astype(np.float32))
           for n in entries]
    seqs = {}
    for name, engine in (("alone", alone), ("together", together)):
        seqs[name] = [engine.open() for _ in prompts]
        for seq, prompt, f in zip(seqs[name], prompts, feats):
            engine.draft_extend(seq, prompt, f)
    single = [alone.draft_extend(seq, *n) for seq, n in zip(seqs["alone"], new)]
    batched = together.draft_extend_batch([(seq, *n) for seq, n in zip(seqs["together"], new)])
    for a, b in zip(single, batched):
        np.testing.assert_allclose(b.logits, a.logits, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(b.hidden, a.hidden, rtol=1e-5, atol=1e-5)
    tree = build_tree([[0], [0, 0]])
    for sa, sb in zip(seqs["alone"], seqs["together"]):  # the caches hold the same entries afterwards
        args = (np.array([5, 6]), rng.standard_normal((2, MODEL.hidden_size)).astype(np.float32),
                tree.position_offsets[1:], tree.mask[1:, 1:])
        np.testing.assert_allclose(together.draft_step(sb, *args).logits, alone.draft_step(sa, *args).logits,
                                   rtol=1e-5, atol=1e-5)


def test_medusa_logits_batch_equals_one_run_per_hidden_state(engines):
    engine = engines["medusa"][0]
    hidden = np.random.default_rng(6).standard_normal((3, MODEL.hidden_size)).astype(np.float32)
    batched = engine.medusa_logits_batch(hidden)
    assert batched.shape == (3, engine.num_medusa_heads, MODEL.vocab_size)
    for row, h in zip(batched, hidden):
        np.testing.assert_allclose(row, engine.medusa_logits(h), rtol=1e-5, atol=1e-5)


def _hybrid(name, engine, model=None, recent=None):
    from trtspec.speculative.ngram_proposer import AcceptanceModel

    dynamic = DynamicTree(depth=3, top_k=3, total_tokens=8) if name == "eagle2" else None
    return make_proposer("hybrid", engine, tree=None if dynamic else build_tree(eval(TREE)), dynamic=dynamic,
                         acceptance=model if model is not None else AcceptanceModel(), recent=recent)


@pytest.mark.parametrize("name", ["medusa", "eagle", "eagle2"])
def test_hybrid_equals_plain_alone_and_in_flight(engines, name):
    """The engine's drafter and the training-free candidates in one tree: every output equals plain decoding, alone
    and 8 in flight (3 at a time); both kinds of node are drafted and accepted."""
    from trtspec.speculative.loop import Request, generate_batch
    from trtspec.speculative.datastore import RecentOutputs
    from trtspec.speculative.ngram_proposer import DRAFTER, AcceptanceModel

    engine = engines[name][0]
    model, recent = AcceptanceModel(), RecentOutputs(min_output=2)
    prompts = [np.concatenate([p, p[:5]]) for p in _prompts(8, seed=4)]  # each repeats its start: lookup has matches
    config = GenerationConfig(max_tokens=32)
    plain = [generate(engine, p, _proposer(name, engine, no_spec=True), config).output_ids for p in prompts]
    alone = [generate(engine, p, _hybrid(name, engine, model, recent), config) for p in prompts]
    assert [r.output_ids for r in alone] == plain
    batched = generate_batch(engine, [Request(p, _hybrid(name, engine, model, recent), config) for p in prompts],
                             max_batch_size=3)
    assert [r.output_ids for r in batched] == plain
    tried = {k[0] for k in model.counts}
    accepted = {k[0] for k, (hits, _) in model.counts.items() if hits}
    assert DRAFTER in tried and accepted - {DRAFTER}  # both drafted (a random tiny drafter is seldom right)


def test_hybrid_needs_a_trained_drafter(engines, tmp_path):
    from trtspec.errors import ConfigError

    plain_engine = type("Plain", (), {"num_medusa_heads": 0, "has_eagle_draft": False, "max_draft_len": 8,
                                      "slot_profiles": (2, 3, 5, 9)})()
    with pytest.raises(ConfigError, match="method hybrid needs an engine with a trained drafter"):
        make_proposer("hybrid", plain_engine)


def test_spinning_is_the_default_except_where_a_drafter_has_its_own_session(engines, monkeypatch):
    monkeypatch.delenv("TRTSPEC_ORT_SPIN", raising=False)
    for name in ("medusa", "eagle"):
        path = engines[name][0].engine_dir
        assert not OrtEngine(path, threads=1).spin  # two sessions' spinning pools would take each other's cores
        assert OrtEngine(path, threads=1, spin=True).spin
    monkeypatch.setenv("TRTSPEC_ORT_SPIN", "0")
    assert not OrtEngine(engines["medusa"][0].engine_dir, threads=1, spin=None).spin
