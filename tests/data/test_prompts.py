"""Prompt sets: the real wheels (counts, categories, incremental ShareGPT) and the user JSONL format."""

from __future__ import annotations

import collections
import json
import tracemalloc

import pytest

from trtspec.data import PROMPT_SETS, Prompt, load_jsonl_prompts, load_prompts
from trtspec.data.prompts import iter_json_array
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
    ("gsm8k", {}, "unknown prompt set 'gsm8k'; known sets: mt-bench, humaneval, sharegpt, champ, or a path"),
    ("mt-bench", {"category": "poetry"}, "prompt set mt-bench has no category 'poetry'; categories: writing, "),
    ("mt-bench", {"limit": -1}, "limit must be >= 0, got -1"),
])
def test_load_prompts_errors(name, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        load_prompts(name, **kwargs)


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
    (['{"prompt": "a", "text": "b"}'], ":1: unknown key.s. text; valid keys: id, category, prompt, messages"),
    (['{"id": "x"}'], ':1: give exactly one of "prompt" .text. or "messages"'),
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
