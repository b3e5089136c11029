"""Prompt sets: the real wheels (counts, categories, incremental ShareGPT) and the user JSONL format."""

from __future__ import annotations

import collections
import json
import tracemalloc

import pytest

from trtspec.data import PROMPT_SETS, Prompt, load_jsonl_prompts, load_prompts
from trtspec.data.prompts import (CODE_EDIT_INSTRUCTIONS, CODE_LINE, MEASURE_SIZE, grounded_category, iter_json_array,
                                  prompt_set_names, second_turn, spread_categories)
from trtspec.errors import ConfigError


def test_mt_bench_has_ten_two_turn_questions_per_category():
    prompts = load_prompts("mt-bench")
    assert len(prompts) == 80 and len({p.id for p in prompts}) == 80
    counts = collections.Counter(p.category for p in prompts)
    assert counts == dict.fromkeys(PROMPT_SETS["mt-bench"].categories, 10)
    assert all(len(p.turns) == 2 and p.messages == ({"role": "user", "content": p.turns[0]},) for p in prompts)
    assert prompts[0].id == "mt-bench/81" and prompts[0].text.startswith("Compose an engaging travel blog post")


def test_mt_bench_category_and_limit():
    coding = load_prompts("mt-bench", category="coding")
    assert len(coding) == 10 and {p.category for p in coding} == {"coding"}
    assert load_prompts("mt-bench", category="coding", limit=3) == coding[:3]
    assert load_prompts("mt-bench", limit=0) == []


def _prompts(categories: str) -> list[Prompt]:
    """One prompt per letter, its category the letter, its id the letter and its place in the list."""
    return [Prompt(f"{c}{i}", c, ()) for i, c in enumerate(categories)]


def test_spread_categories_takes_each_category_in_its_share():
    # equal categories: one of each in turn, each category in its own order
    assert [p.id for p in spread_categories(_prompts("aaabbbccc"))] == ["a0", "b3", "c6", "a1", "b4", "c7", "a2",
                                                                        "b5", "c8"]
    # 3:1 — every first N holds about three a's to one b, the b's spread out (ties: the first category seen first)
    spread = spread_categories(_prompts("aaaaaabb"))
    assert "".join(p.category for p in spread) == "aabaaaba"
    for n in range(1, len(spread) + 1):
        assert abs(sum(p.category == "b" for p in spread[:n]) - n / 4) <= 1
    # a permutation, the same every time; one category (or none) keeps the order as it is
    mixed = _prompts("cabbcaacbbba")
    assert sorted(p.id for p in spread_categories(mixed)) == sorted(p.id for p in mixed)
    assert spread_categories(mixed) == spread_categories(list(mixed))
    assert spread_categories(_prompts("aaaa")) == _prompts("aaaa") and spread_categories([]) == []


def test_mt_bench_spread_holds_every_category_in_each_first_eight():
    spread = load_prompts("mt-bench", spread=True)
    assert sorted(p.id for p in spread) == sorted(p.id for p in load_prompts("mt-bench"))
    for start in range(0, 80, 8):
        assert {p.category for p in spread[start:start + 8]} == set(PROMPT_SETS["mt-bench"].categories)
    assert [p.id for p in spread[:2]] == ["mt-bench/81", "mt-bench/91"]  # writing's first, then roleplay's
    assert load_prompts("mt-bench", spread=True, limit=3) == spread[:3]


def test_humaneval_prompts_ask_for_the_completion():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164 and prompts[0].id == "humaneval/0" and prompts[-1].id == "humaneval/163"
    assert all(p.category == "code" and len(p.messages) == 1 for p in prompts)
    assert all(p.text.startswith("Complete the following Python function.") and "def " in p.text for p in prompts)


def test_sharegpt_reads_only_what_it_needs():
    tracemalloc.start()
    try:
        prompts = load_prompts("sharegpt", limit=100)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(prompts) == 100 and all(p.text.strip() and p.category == "chat" for p in prompts)
    assert len({p.id for p in prompts}) == 100
    # the file is 125 MB: a bounded read of a few 1 MB chunks stays small (no timing: CI machines are shared)
    assert peak < 32 * 2**20, peak


def test_sharegpt_truncated_file_yields_every_complete_conversation():
    prompts = load_prompts("sharegpt")
    assert 17_000 < len(prompts) <= 17_671  # 17,671 complete conversations; a few have no human turn


def test_champ_problems():
    prompts = load_prompts("champ")
    assert len(prompts) == 270 and "@@" not in "".join(p.text for p in prompts)
    assert collections.Counter(p.category for p in prompts) == {
        "number-theory": 80, "inequality": 50, "polynomial": 50, "sequence": 50, "combinatorics": 40}


@pytest.mark.parametrize("name, kwargs, message", [
    ("gsm8k", {}, "unknown prompt set 'gsm8k'; known sets: mt-bench, humaneval, sharegpt, champ, "
                  "sharegpt-grounded, code-edit, mt-bench-2turn, or a path"),
    ("mt-bench", {"category": "poetry"}, "prompt set mt-bench has no category 'poetry'; categories: writing, "),
    ("mt-bench", {"limit": -1}, "limit must be >= 0, got -1"),
    ("code-edit", {"category": "poetry"}, "prompt set code-edit has no category 'poetry'; categories: refactor, "),
    ("sharegpt-grounded", {"category": "chat"}, "prompt set sharegpt-grounded has no category 'chat'; "
                                                "categories: code, text$"),
    ("mt-bench-2turn", {"category": "code"}, "prompt set mt-bench-2turn has no category 'code'; categories: wri"),
    ("mt-bench", {"split": "tune"}, "prompt set mt-bench has no splits; split= works for sharegpt-grounded, "
                                    "code-edit$"),
    ("x.jsonl", {"split": "measure"}, "prompt set x.jsonl has no splits"),
    ("code-edit", {"split": "train"}, "unknown split 'train'; splits: measure, tune$"),
])
def test_load_prompts_errors(name, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_prompts(name, **kwargs)


def test_prompt_set_names():
    assert prompt_set_names() == tuple(PROMPT_SETS) == (
        "mt-bench", "humaneval", "sharegpt", "champ", "sharegpt-grounded", "code-edit", "mt-bench-2turn")
    assert [n for n in PROMPT_SETS if PROMPT_SETS[n].two_turn] == ["mt-bench-2turn"]


# sharegpt-grounded: the selection rule on handmade strings

PROSE = ("The quarterly meeting covered the new office move, the budget for the spring campaign and the plan to "
         "hire two more support engineers before the end of the year. Everyone agreed that the move should happen "
         "in March, once the lease on the old building runs out, and that the campaign needs a clearer message. "
         "Maria will draft the job descriptions, and Tom will ask three agencies for quotes by Friday. ")
assert 400 < len(PROSE) < 450 and PROSE.isascii()
CODE = "import os\n\ndef size(path):\n    total = 0\n    for name in os.listdir(path):\n        total += 1\n" \
       "    return total\n"


@pytest.mark.parametrize("text, expected", [
    ("Summarize the following:\n\n" + PROSE, "text"),
    ("Can you paraphrase this? " + PROSE, None),  # the material is on the instruction's line: no colon/newline
    ("Can you paraphrase this?\n" + PROSE, "text"),
    ("Please proofread this email: " + PROSE, "text"),
    ("Rewrite the given paragraph so that it starts with an anecdote: " + PROSE, "text"),
    (PROSE + "\n\nSummarize this email in three bullet points.", "text"),  # the instruction at the end
    ("Please fix the bug in this code:\n```python\n" + CODE + "```\n" + PROSE[:300], "code"),
    ("Explain what this function does.\n\n" + CODE + "\n" + PROSE[:300], "code"),  # code lines, no fence
    (CODE + PROSE[:300] + "\nCan you refactor it to use pathlib?", "code"),
    ("Summarize the following:\n\n" + PROSE[:200], None),  # under 400 characters
    ("Summarize the following:\n\n" + PROSE * 20, None),  # over 6000 characters
    ("Summarize the following:\n\n" + "会议讨论了新办公室的搬迁和春季活动的预算。" * 30, None),  # not ASCII
    ("Do not summarize the following:\n\n" + PROSE, None),  # negated
    ("Don't rewrite this yet:\n\n" + PROSE, None),
    ("Summarize the following:\n\n" + PROSE + " If you understand, just say OK.", None),  # context feeding
    ("Summarize the following when I ask; for now acknowledge it:\n" + PROSE, None),
    ("Write a story about a meeting in which " + PROSE, None),  # no instruction keyword
    ("How can I improve my sleep schedule when " + PROSE, None),  # "improve" refers to nothing given
    (PROSE + "\nPlease rewrite this text.\n" + PROSE, None),  # the instruction in the middle only
    ("Please rewrite this in a formal tone and " + PROSE + ": ok", None),  # under 200 characters after the colon
])
def test_grounded_category_rule(text, expected):
    assert grounded_category(text) == expected


@pytest.mark.parametrize("line, code_like", [
    ("import numpy as np", True), ("def f(x):", True), ("  return {", True), ("x = 1", True),
    ("total += len(items)", True), ("print(total)", True), ("SELECT id FROM users", True), ("</div>", True),
    ("// a comment", True), ("MainScreen:", True), ("orientation: 'vertical'", True), ('  "name": "x",', True),
    ("};", True),
    ("The meeting covered the budget.", False), ("Mermaid: Worthy words for my rival!", False),
    ("Note: see the plan (attached)", False), ("We need length(t) samples.", False), ("", False),
])
def test_code_line(line, code_like):
    assert bool(CODE_LINE.match(line)) == code_like


def test_sharegpt_grounded_is_sharegpt_filtered_by_the_rule():
    prompts = load_prompts("sharegpt-grounded", limit=60)
    assert prompts == load_prompts("sharegpt-grounded", limit=60)  # deterministic
    assert len(prompts) == 60 and len({p.id for p in prompts}) == 60 and len({p.text for p in prompts}) == 60
    for p in prompts:
        assert p.category == grounded_category(p.text) in PROMPT_SETS["sharegpt-grounded"].categories
        assert 400 <= len(p.text) <= 6000 and sum(c.isascii() for c in p.text) >= 0.95 * len(p.text)
        assert p.id.startswith("sharegpt/") and p.messages == ({"role": "user", "content": p.text},)
    assert {p.category for p in prompts} == {"code", "text"}
    # the same as filtering the plain ShareGPT prompts, in order, exact duplicates dropped
    seen: set[str] = set()
    expected = []
    for p in load_prompts("sharegpt", limit=1500):
        if p.text not in seen and (category := grounded_category(p.text)):
            seen.add(p.text)
            expected.append(Prompt(p.id, category, p.messages, p.turns))
    assert len(expected) > 20 and prompts[:len(expected)] == expected[:60]


def test_sharegpt_grounded_streams():
    tracemalloc.start()
    try:
        prompts = load_prompts("sharegpt-grounded", limit=MEASURE_SIZE)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(prompts) == MEASURE_SIZE and peak < 32 * 2**20, peak


def test_sharegpt_grounded_splits():
    first = load_prompts("sharegpt-grounded", limit=MEASURE_SIZE + 10)
    assert load_prompts("sharegpt-grounded", split="measure") == first[:MEASURE_SIZE]
    assert load_prompts("sharegpt-grounded", split="tune", limit=10) == first[MEASURE_SIZE:]
    code = [p for p in first if p.category == "code"]
    assert load_prompts("sharegpt-grounded", split="measure", category="code") == code[:sum(
        p.category == "code" for p in first[:MEASURE_SIZE])]


# code-edit

def test_code_edit_asks_to_edit_the_whole_canonical_function():
    import gzip

    from trtspec.hub.fetch import ensure_package

    source = PROMPT_SETS["code-edit"]
    path = ensure_package(source.module, source.requirement) / source.file
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    prompts = load_prompts("code-edit")
    assert prompts == load_prompts("code-edit") and len(prompts) == len(rows) == 164
    assert [p.id for p in prompts] == [f"code-edit/{i}" for i in range(164)]
    for i, (p, row) in enumerate(zip(prompts, rows)):
        category, instruction = CODE_EDIT_INSTRUCTIONS[i % len(CODE_EDIT_INSTRUCTIONS)]
        assert p.category == category and p.text.startswith(instruction)
        assert row["canonical_solution"].rstrip("\n") in p.text and row["prompt"].strip("\n") in p.text
        assert (row["prompt"].lstrip("\n") + row["canonical_solution"].rstrip("\n") + "\n```") in p.text
        assert "\n```python\n" in p.text and p.text.endswith("```") and p.turns == (p.text,)
    assert PROMPT_SETS["code-edit"].categories == ("refactor", "rename", "comment", "loops", "validate", "docstring")
    assert collections.Counter(p.category for p in prompts) == {
        "refactor": 28, "rename": 28, "comment": 27, "loops": 27, "validate": 27, "docstring": 27}


def test_code_edit_splits():
    prompts = load_prompts("code-edit")
    measure, tune = load_prompts("code-edit", split="measure"), load_prompts("code-edit", split="tune")
    assert measure == prompts[:MEASURE_SIZE] and tune == prompts[MEASURE_SIZE:] and len(tune) == 124
    assert load_prompts("code-edit", split="tune", category="rename", limit=2) == [
        p for p in tune if p.category == "rename"][:2]


# mt-bench-2turn

def test_mt_bench_2turn_is_mt_bench_marked_two_turn():
    prompts = load_prompts("mt-bench-2turn")
    assert prompts == load_prompts("mt-bench") and PROMPT_SETS["mt-bench-2turn"].two_turn
    assert not PROMPT_SETS["mt-bench"].two_turn
    assert load_prompts("mt-bench-2turn", category="math") == load_prompts("mt-bench", category="math")
    first = prompts[0]
    assert second_turn(first, "My blog post.") == (
        {"role": "user", "content": first.turns[0]},
        {"role": "assistant", "content": "My blog post."},
        {"role": "user", "content": first.turns[1]})


def test_second_turn_keeps_a_system_prompt_and_needs_two_turns():
    two = Prompt("p", "c", ({"role": "system", "content": "s"}, {"role": "user", "content": "u1"}), ("u1", "u2"))
    assert second_turn(two, "a") == ({"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                                     {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"})
    one = load_prompts("humaneval", limit=1)[0]
    with pytest.raises(ConfigError, match="prompt humaneval/0 has 1 turn.s.; a second turn needs 2"):
        second_turn(one, "answer")


@pytest.mark.parametrize("lines, expected", [
    (['{"prompt": "hi"}'], [Prompt("1", "default", ({"role": "user", "content": "hi"},), ("hi",))]),
    (['', '{"id": "a", "category": "math", "prompt": "2+2?"}', '   '],
     [Prompt("a", "math", ({"role": "user", "content": "2+2?"},), ("2+2?",))]),
    (['{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u1"}, '
      '{"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}]}'],
     [Prompt("1", "default", ({"role": "system", "content": "s"}, {"role": "user", "content": "u1"},
                              {"role": "assistant", "content": "a"}, {"role": "user", "content": "u2"}),
             ("u1", "u2"))]),
    (['{"prompt": "é 👋"}', '{"prompt": "b"}'],
     [Prompt("1", "default", ({"role": "user", "content": "é 👋"},), ("é 👋",)),
      Prompt("2", "default", ({"role": "user", "content": "b"},), ("b",))]),
    (['{"prompt": "a"}', '{"prompt": '], ":2: not valid JSON"),
    (['[1, 2]'], ":1: expected a JSON object, got list"),
    (['{"input_ids": [5, 0, 7]}', '{"id": "b", "category": "c", "prompt": "x"}'],
     [Prompt("1", "default", (), input_ids=(5, 0, 7)), Prompt("b", "c", ({"role": "user", "content": "x"},), ("x",))]),
    (['{"prompt": "a", "text": "b"}'],
     ":1: unknown key.s. text; valid keys: id, category, prompt, messages, input_ids$"),
    (['{"id": "x"}'], ':1: give exactly one of "prompt" .text., "messages" .a chat list. or "input_ids"'),
    (['{"prompt": "a", "input_ids": [1]}'], ':1: give exactly one of "prompt"'),
    (['{"input_ids": []}'], ':1: "input_ids" must be a non-empty list of token ids'),
    (['{"input_ids": [1, "2"]}'], ':1: "input_ids" must be a non-empty list of token ids'),
    (['{"input_ids": [1, -2]}'], ':1: "input_ids" must be a non-empty list of token ids'),
    (['{"input_ids": [true]}'], ':1: "input_ids" must be a non-empty list of token ids'),
    (['{"prompt": "a", "messages": []}'], ':1: give exactly one of "prompt"'),
    (['{"prompt": "  "}'], ':1: "prompt" must be a non-empty string'),
    (['{"prompt": 5}'], ':1: "prompt" must be a non-empty string'),
    (['{"id": 3, "prompt": "a"}'], ':1: "id" must be a non-empty string'),
    (['{"category": "", "prompt": "a"}'], ':1: "category" must be a non-empty string'),
    (['{"messages": []}'], ':1: "messages" must be a non-empty list'),
    (['{"messages": [{"role": "user"}]}'], ':1: "messages".0. must be an object with string "role" and "content"'),
    (['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'], ":2: duplicate id 'a'; ids must be unique"),
])
def test_jsonl_prompts(tmp_path, lines, expected):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=f"^{path}{expected}"):
            load_jsonl_prompts(path)
    else:
        assert load_jsonl_prompts(path) == expected
        assert load_prompts(str(path)) == expected  # a .jsonl path is accepted where a set name is


def test_jsonl_limit_category_and_missing_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"q{i}", "category": "ab"[i % 2]}) + "\n" for i in range(6)))
    assert [p.id for p in load_jsonl_prompts(path, category="b", limit=2)] == ["2", "4"]
    with pytest.raises(ConfigError, match="prompt file .*missing.jsonl does not exist"):
        load_jsonl_prompts(tmp_path / "missing.jsonl")


VALUES = [123, -4.5e3, 'a],["b', {"x": [1, 2, {"y": "}"}]}, [], {}, None, True, "é👋", 7, 1e-7]


@pytest.mark.parametrize("chunk_chars", [1, 2, 3, 7, 64, 1 << 20])
def test_iter_json_array_any_chunking_and_any_truncation(tmp_path, chunk_chars):
    elements = [json.dumps(v, ensure_ascii=False) for v in VALUES]
    text = "[\n " + ",\n ".join(elements) + "\n]"
    prefixes = ["[\n " + ",\n ".join(elements[:k + 1]) for k in range(len(VALUES))]
    ends = [len(p) + 1 for p in prefixes[:-1]] + [len(text)]  # just past each element's "," or the final "]"
    path = tmp_path / "a.json"
    path.write_text(text, encoding="utf-8")
    assert list(iter_json_array(path, chunk_chars=chunk_chars)) == VALUES
    for cut in range(1, len(text)):
        path.write_text(text[:cut], encoding="utf-8")
        got = list(iter_json_array(path, chunk_chars=chunk_chars))
        assert got == VALUES[:len(got)], cut
        assert len(got) >= sum(end <= cut for end in ends), cut  # every element followed by "," or "]" is read


@pytest.mark.parametrize("text, expected", [
    ("[]", []),
    ("  [ 1 ,2 ]  ", [1, 2]),
    ("[1,]", [1]),
    ('{"a": 1}', "expected a JSON array"),
    ("[1 2]", "expected ',' or ']' after an array element, got '2'"),
    ("[1.x]", "expected ',' or ']' after an array element, got '.'"),
])
def test_iter_json_array_table(tmp_path, text, expected):
    path = tmp_path / "a.json"
    path.write_text(text)
    if isinstance(expected, str):
        with pytest.raises(ConfigError, match=expected):
            list(iter_json_array(path, chunk_chars=2))
    else:
        assert list(iter_json_array(path, chunk_chars=2)) == expected


def test_what_a_generator_encodes_and_text_of_token_ids(tmp_path):
    chat = ({"role": "system", "content": "s"}, {"role": "user", "content": "u"})
    assert Prompt("a", "c", ({"role": "user", "content": "hi"},)).generation_input == "hi"
    assert Prompt("a", "c", chat).generation_input == list(chat)
    ids = Prompt("a", "c", (), input_ids=(4, 5))
    assert ids.generation_input == [4, 5]
    with pytest.raises(ConfigError, match=r'^prompt a holds token ids \("input_ids"\); this needs text or messages$'):
        ids.text
