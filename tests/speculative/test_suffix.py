"""The suffix drafter: the datastore file and index, the recent-outputs store, drafts from both, losslessness, and
`trtspec datastore build` on every source kind with its errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.speculative.loop import GenerationConfig, Request, generate, generate_batch
from trtspec.speculative.datastore import Datastore, RecentOutputs, context_key
from trtspec.speculative.methods import make_proposer
from trtspec.speculative.ngram_proposer import SUFFIX_CORPUS, SUFFIX_RECENT, AcceptanceModel, NgramConfig, NgramProposer
from trtspec.speculative.proposer import NoDraft
from tests.speculative.test_ngram import COSTS, MarkovEngine, _deterministic_table, _prompts

@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory):
    from trtspec.testing import write_tiny_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(out)
    return out


DOCS = [[1, 2, 3, 4, 5], [9, 2, 3, 4, 6], [2, 3, 4, 5, 7, 8], [3, 3, 3]]


def _store(docs=DOCS, max_ngram=3, vocab=20) -> Datastore:
    return Datastore.from_documents(docs, vocab_size=vocab, max_ngram=max_ngram)


def _rows(match) -> list[list[int]]:
    return [[t for t in row if t >= 0] for row in match.continuations.tolist()]


# ---- the static index ----------------------------------------------------------------------------------

def test_lookup_finds_the_longest_suffix_and_every_occurrence():
    match = _store().lookup([7, 2, 3, 4], depth=3)
    assert match.n == 3 and match.occurrences == 3  # "2 3 4" occurs in three documents
    assert sorted(_rows(match)) == [[5], [5, 7, 8], [6]]  # continuations stop at each document's end
    match = _store().lookup([0, 9, 2], depth=2)
    assert match.n == 2 and _rows(match) == [[3, 4]]  # "9 2" once; "0 9 2" never


def test_no_ngram_spans_two_documents_and_a_missing_suffix_is_no_match():
    store = _store()
    assert store.lookup([5, 9], min_ngram=2).empty  # "5" ends document 0, "9" starts document 1: not adjacent
    assert store.lookup([6]).empty  # "6" only ends a document: nothing follows it
    assert store.lookup([19]).empty and store.lookup([]).empty


def test_lookup_samples_evenly_and_reports_the_true_count():
    docs = [[1, k] for k in range(2, 18)]
    match = _store(docs).lookup([1], max_positions=4, depth=1)
    assert match.occurrences == 16 and len(match.continuations) == 4
    assert _rows(match) == [[2], [6], [10], [14]]  # spread over all occurrences, in corpus order


def test_context_key_matches_the_index():
    store = _store()
    assert context_key([2, 3, 4], 3) in set(store.keys[2].tolist())
    assert context_key([2, 3, 9], 3) not in set(store.keys[2].tolist())


def test_save_and_load_round_trip(tmp_path):
    store = _store()
    store.save(tmp_path / "d.ds")
    loaded = Datastore.load(tmp_path / "d.ds")
    assert loaded.info == store.info
    assert _rows(loaded.lookup([2, 3, 4], depth=3)) == _rows(store.lookup([2, 3, 4], depth=3))
    assert [p for p in tmp_path.iterdir()] == [tmp_path / "d.ds"]  # no temporary file left


@pytest.mark.parametrize("damage,message", [
    (lambda b: b"not a store" + b[11:], "is not a trtspec datastore"),
    (lambda b: b[:-3], "truncated"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "is corrupt: its data does not match"),
    (lambda b: b[:30] + b"#" + b[31:], "header is corrupt"),
])
def test_a_damaged_file_is_one_line_naming_it(tmp_path, damage, message):
    path = tmp_path / "d.ds"
    _store().save(path)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ConfigError, match=message) as e:
        Datastore.load(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_a_missing_file_and_a_foreign_engine_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        Datastore.load(tmp_path / "nope.ds")
    store = _store(vocab=20)
    with pytest.raises(ConfigError, match="vocabulary of 20 tokens, the engine has 12"):
        store.check_engine(12)
    store.info = type(store.info)(**{**store.info.to_dict(), "sources": (), "tokenizer": "a" * 64})
    with pytest.raises(ConfigError, match="another tokenizer"):
        store.check_engine(20, "b" * 64)
    store.check_engine(20, "a" * 64)


def test_ids_outside_the_vocabulary_and_a_bad_ngram_range_are_refused():
    with pytest.raises(ConfigError, match="document 1: token id 25 is outside the vocabulary 0..19"):
        Datastore.from_documents([[1, 2], [3, 25]], vocab_size=20)
    with pytest.raises(ConfigError, match="max_ngram must be an int in 1..8, got 0"):
        Datastore.from_documents([[1, 2]], vocab_size=20, max_ngram=0)


def test_max_tokens_bounds_the_corpus():
    store = Datastore.from_documents(iter(DOCS), vocab_size=20, max_tokens=7)
    assert store.info.tokens == 7 and store.info.documents == 2


# ---- recent outputs --------------------------------------------------------------------------------------

def test_recent_outputs_are_searched_most_recent_first_and_evicted():
    recent = RecentOutputs(capacity=20, max_ngram=3, min_output=2)
    recent.add([1, 2, 3, 4, 5, 6])
    recent.add([1, 2, 3, 9, 9, 9])
    match = recent.lookup([8, 2, 3], max_positions=1, depth=3)
    assert match.n == 2 and match.occurrences == 2 and _rows(match) == [[9, 9, 9]]  # the newest occurrence
    for k in range(7):  # past 2 x capacity the oldest outputs go, down to the capacity
        recent.add([10 + k] * 6)
        assert recent.tokens_held <= 40
    assert recent.lookup([1, 2, 3]).empty
    recent.add([1])  # too short to index
    assert recent.lookup([0, 1]).empty
    recent.clear()
    assert recent.tokens_held == 0 and recent.lookup([10 + 6]).empty


# ---- drafts ----------------------------------------------------------------------------------------------

def test_the_corpus_drafts_its_most_frequent_continuation_first():
    docs = [[4, 5, 6, 7, 8]] * 3 + [[4, 5, 6, 1, 2]]
    store = _store(docs, max_ngram=4)
    proposer = NgramProposer(COSTS, NgramConfig(recycle_top_k=0), sources=((SUFFIX_CORPUS, store),))
    proposer.start(None, 0, None, np.array([11, 12, 4, 5]), 6)  # "4 5 6" never occurred in the sequence itself
    draft = proposer.propose(6)
    assert draft.tree.num_nodes >= 1
    first = draft.tree.children[0]
    assert int(draft.tokens[first[0]]) == 7  # followed "4 5 6" three times in four
    if len(first) > 1:
        assert int(draft.tokens[first[1]]) == 1
    assert draft.node_p[0] >= max(draft.node_p)  # the root's best child is the likeliest node


def test_recent_outputs_draft_for_a_later_request():
    engine = MarkovEngine(_deterministic_table(12))
    recent, model = RecentOutputs(min_output=2), AcceptanceModel()
    config = GenerationConfig(max_tokens=30)
    prompt = np.array([3, 1])
    first = generate(engine, prompt, make_proposer("suffix", engine, acceptance=model, recent=recent), config)
    assert recent.tokens_held == 30
    again = generate(engine, np.array([5, 3, 1]), make_proposer("suffix", engine, acceptance=model, recent=recent),
                     config)
    assert again.output_ids == first.output_ids  # the same chain from the same last token
    ngram = generate(engine, np.array([5, 3, 1]), make_proposer("ngram", engine, acceptance=AcceptanceModel()),
                     config)
    assert again.stats.steps < ngram.stats.steps  # the first request's output drafted for the second


def test_suffix_greedy_output_is_plain_greedy_output_batch_1_and_8():
    vocab = 12
    engine = MarkovEngine(_deterministic_table(vocab))
    prompts = _prompts(vocab, 16)
    config = GenerationConfig(max_tokens=40)
    plain = [generate(engine, p, NoDraft(), config).output_ids for p in prompts]
    corpus = Datastore.from_documents(plain[:4], vocab_size=vocab)
    recent, model = RecentOutputs(min_output=2), AcceptanceModel()

    def proposer():
        return make_proposer("suffix", engine, acceptance=model, recent=recent, datastore=corpus)

    alone = [generate(engine, p, proposer(), config) for p in prompts]
    assert [r.output_ids for r in alone] == plain
    batched = generate_batch(engine, [Request(p, proposer(), config) for p in prompts], max_batch_size=8)
    assert [r.output_ids for r in batched] == plain
    kinds = {k[0] for k in model.counts}
    assert {SUFFIX_CORPUS, SUFFIX_RECENT} <= kinds  # both sources drafted


def test_suffix_needs_an_engine_with_k():
    engine = MarkovEngine(_deterministic_table(12), max_draft_len=0)
    with pytest.raises(ConfigError, match="method suffix needs an engine built with --max-draft-len"):
        make_proposer("suffix", engine)


# ---- trtspec datastore build --------------------------------------------------------------------------------

def test_build_from_token_ids_text_and_chat(tmp_path, tiny_tokenizer_dir):
    rows = [{"output_ids": [1, 2, 3, 4]}, {"text": "hello world"}, {"messages": [
        {"role": "user", "content": "not indexed"}, {"role": "assistant", "content": "an answer"}]}]
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    out = tmp_path / "store.ds"
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(src), "--out", str(out), "--tokenizer",
                                      str(tiny_tokenizer_dir), "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output.splitlines()[-1])
    assert info["documents"] == 3 and info["tokens"] > 4 and len(info["tokenizer"]) == 64
    result = CliRunner().invoke(cli, ["datastore", "inspect", str(out)])
    assert result.exit_code == 0 and "3 documents" in result.output


def test_several_sources_go_into_one_store_in_order(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text('{"output_ids": [1, 2, 3]}\n{"output_ids": [4, 5, 6]}\n')
    b.write_text('{"output_ids": [7, 8, 9]}\n')
    out = tmp_path / "s.ds"
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(a), "--from", str(b), "--out", str(out),
                                      "--limit", "1", "--json"])
    assert result.exit_code == 0, result.output
    store = Datastore.load(out)
    assert store.info.documents == 2 and store.info.sources == (str(a), str(b))  # --limit: per source
    assert store.tokens.tolist() == [1, 2, 3, -1, 7, 8, 9, -1]
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(a), "--from", str(tmp_path / "x.jsonl"),
                                      "--out", str(tmp_path / "t.ds")])
    assert result.exit_code == 1 and "x.jsonl: no such file" in result.output  # checked before any work
    assert not (tmp_path / "t.ds").exists()


def test_build_from_a_folder_of_text(tmp_path, tiny_tokenizer_dir):
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "a.py").write_text("def f(x):\n    return x + 1\n")
    (tmp_path / "src" / "sub" / "b.md").write_text("# notes\nsome text\n")
    (tmp_path / "src" / "c.bin").write_bytes(b"\x00\x01")
    out = tmp_path / "store.ds"
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(tmp_path / "src"), "--out", str(out),
                                      "--tokenizer", str(tiny_tokenizer_dir), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["documents"] == 2


@pytest.mark.parametrize("lines,args,message", [
    (['{"output_ids": [1, 2]}', "{oops"], [], "rows.jsonl:2: not JSON"),
    (['{"prompt": "x"}'], [], "rows.jsonl:1: expected output_ids, text"),
    (['{"output_ids": [1, "a"]}'], [], "rows.jsonl:1: output_ids must be a list of token ids"),
    (['{"text": "words"}'], ["--no-tokenizer"], "holds text: pass --tokenizer"),
    (['{"output_ids": [1, 2]}'], ["--max-ngram", "9"], "max_ngram must be an int in 1..8, got 9"),
    (['{"output_ids": [1, 2]}'], ["--max-tokens", "0"], "--max-tokens must be a positive number, got 0"),
    (['{"output_ids": [1, 99999]}'], [], "token id 99999 is outside the vocabulary"),
])
def test_build_errors_are_one_line_and_leave_nothing(tmp_path, tiny_tokenizer_dir, lines, args, message):
    src = tmp_path / "rows.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "store.ds"
    tokenizer = [] if "--no-tokenizer" in args else ["--tokenizer", str(tiny_tokenizer_dir)]
    args = [a for a in args if a != "--no-tokenizer"]
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(src), "--out", str(out), *tokenizer, *args])
    assert result.exit_code == 1 and message in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl"]  # no store, no temporary file


def test_build_refuses_an_existing_file_without_force(tmp_path):
    src = tmp_path / "rows.jsonl"
    src.write_text('{"output_ids": [1, 2, 3]}\n')
    out = tmp_path / "store.ds"
    out.write_text("keep me")
    args = ["datastore", "build", "--from", str(src), "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "exists; pass --force" in result.output
    assert out.read_text() == "keep me"
    assert CliRunner().invoke(cli, [*args, "--force"]).exit_code == 0
    assert Datastore.load(out).info.documents == 1


def test_a_missing_source_is_named(tmp_path):
    result = CliRunner().invoke(cli, ["datastore", "build", "--from", str(tmp_path / "none.jsonl"), "--out",
                                      str(tmp_path / "o.ds")])
    assert result.exit_code == 1 and "none.jsonl: no such file or folder" in result.output


def test_suffix_sampled_output_keeps_the_target_distribution():
    from tests.speculative.test_ngram import assert_keeps_the_target_distribution

    recent, model = RecentOutputs(min_output=2), AcceptanceModel()
    corpus = _store([[0, 1, 2, 3, 0, 1, 2, 3], [1, 3, 2, 0]], vocab=4)
    engine = MarkovEngine(_deterministic_table(4))
    assert_keeps_the_target_distribution(
        lambda: make_proposer("suffix", engine, acceptance=model, recent=recent, datastore=corpus), runs=4000)
