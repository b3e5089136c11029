"""Suffix datastores for the `suffix` drafter: where the current suffix of a sequence continued elsewhere.

`Datastore` is a read-only, memory-mapped corpus (`trtspec datastore build`) whose n-grams are sorted 64-bit keys,
one binary search per n; `RecentOutputs` is the server's own recent outputs, bounded and updated as sequences finish.
Both return a `SuffixMatch` (match length, occurrences, a sample of continuations) that `ngram_proposer` turns into a
frequency-weighted tree. The two sources and the file format: docs/drafting.md, "Suffix datastores".
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from trtspec.errors import ConfigError

MAGIC = b"TRTSPEC-DSTORE1\n"
ALIGN = 64
SEPARATOR = -1  # between documents: no n-gram spans it, no continuation runs past it
DEFAULT_MAX_NGRAM = 4
MAX_NGRAM_LIMIT = 8
_MULT = np.uint64(0x9E3779B97F4A7C15)  # odd: the rolling key is a bijection of each added token
_MASK = (1 << 64) - 1


@dataclass(frozen=True)
class DatastoreInfo:
    """What a datastore was built from and for; checked against the engine that opens it."""

    vocab_size: int
    max_ngram: int
    tokens: int  # corpus tokens, separators excluded
    documents: int
    tokenizer: str = ""  # SHA-256 of the tokenizer.json it was tokenized with ("" for token ids as given)
    sources: tuple[str, ...] = ()
    trtspec: str = ""

    def to_dict(self) -> dict:
        return {**asdict(self), "sources": list(self.sources)}


@dataclass(frozen=True)
class SuffixMatch:
    """The continuations of the longest suffix (n tokens) that a source has seen, from a sample of its
    occurrences: `continuations[i]` is a row of up to `depth` tokens, cut at the first SEPARATOR (-1)."""

    n: int
    occurrences: int
    continuations: np.ndarray  # int64 [samples, depth], -1 after a row's end

    @property
    def empty(self) -> bool:
        return self.occurrences == 0


NO_MATCH = SuffixMatch(0, 0, np.zeros((0, 0), np.int64))


def context_key(context: list[int], n: int) -> int:
    """The key of the n-gram context[-n:] as `Datastore` stores it (the rolling key, newest token first)."""
    h = 0
    for token in reversed(context[len(context) - n:]):
        h = (h * int(_MULT) + token + 1) & _MASK
    return h


class Datastore:
    """A read-only suffix index over a token corpus (see the module docstring)."""

    def __init__(self, tokens: np.ndarray, keys: list[np.ndarray], positions: list[np.ndarray],
                 info: DatastoreInfo, path: Path | None = None):
        self.tokens, self.keys, self.positions, self.info, self.path = tokens, keys, positions, info, path

    @classmethod
    def from_documents(cls, documents: Iterable, *, vocab_size: int, max_ngram: int = DEFAULT_MAX_NGRAM,
                       tokenizer: str = "", sources: tuple[str, ...] = (), max_tokens: int | None = None,
                       on_document=None) -> Datastore:
        """Index token-id documents (each a sequence of ints in 0..vocab_size-1); stop once `max_tokens` corpus
        tokens are in (the last document is cut)."""
        _check_max_ngram(max_ngram)
        chunks, total, count = [], 0, 0
        for doc in documents:
            ids = np.asarray(doc, dtype=np.int64).reshape(-1)
            if max_tokens is not None:
                ids = ids[:max_tokens - total]
            if len(ids) == 0:
                if max_tokens is not None and total >= max_tokens:
                    break
                continue
            if ids.min() < 0 or ids.max() >= vocab_size:
                bad = int(ids[(ids < 0) | (ids >= vocab_size)][0])
                raise ConfigError(f"document {count}: token id {bad} is outside the vocabulary 0..{vocab_size - 1}")
            chunks += [ids.astype(np.int32), np.array([SEPARATOR], np.int32)]
            total, count = total + len(ids), count + 1
            if on_document is not None:
                on_document(len(ids))
            if max_tokens is not None and total >= max_tokens:
                break
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.int32)
        keys, positions = _index(tokens, max_ngram)
        from trtspec import __version__

        info = DatastoreInfo(vocab_size=vocab_size, max_ngram=max_ngram, tokens=total, documents=count,
                             tokenizer=tokenizer, sources=tuple(sources), trtspec=__version__)
        return cls(tokens, keys, positions, info)

    # ---- lookup ----------------------------------------------------------------------------------------

    def lookup(self, context: list[int], *, min_ngram: int = 1, max_ngram: int | None = None,
               max_positions: int = 32, depth: int = 16) -> SuffixMatch:
        """The longest suffix of `context` (max_ngram tokens down to min_ngram) that occurs in the corpus, with
        the continuations of up to `max_positions` of its occurrences, evenly spread."""
        top = min(self.info.max_ngram, max_ngram or self.info.max_ngram, len(context))
        h = 0
        found = None
        for n in range(1, top + 1):  # the rolling key grows one older token at a time
            h = (h * int(_MULT) + context[-n] + 1) & _MASK
            if n < min_ngram:
                continue
            keys = self.keys[n - 1]
            key = np.uint64(h)
            lo = int(np.searchsorted(keys, key, "left"))
            hi = int(np.searchsorted(keys, key, "right"))
            if hi <= lo:
                break  # a longer suffix cannot occur where a shorter one does not
            found = (n, lo, hi)
        if found is None:
            return NO_MATCH
        n, lo, hi = found
        picks = lo + (np.arange(min(max_positions, hi - lo)) * (hi - lo) // min(max_positions, hi - lo))
        starts = np.asarray(self.positions[n - 1][picks], dtype=np.int64)
        tail = np.asarray(context[-n:], dtype=np.int64)
        back = self.tokens[starts[:, None] + np.arange(-n, 0)]
        starts = starts[(back == tail).all(axis=1)]  # 64-bit keys: a collision is improbable, but checked
        if len(starts) == 0:
            return NO_MATCH
        return SuffixMatch(n, hi - lo, _continuations(self.tokens, starts, depth))

    # ---- file --------------------------------------------------------------------------------------------

    def save(self, path: Path) -> None:
        """Write the store to `path` atomically (a temporary sibling renamed into place)."""
        from trtspec.outdir import atomic_output_file

        arrays = {"tokens": self.tokens}
        for n in range(1, self.info.max_ngram + 1):
            arrays[f"keys.{n}"], arrays[f"positions.{n}"] = self.keys[n - 1], self.positions[n - 1]
        entries, offset, digest = {}, 0, hashlib.sha256()
        for name, array in arrays.items():
            array = np.ascontiguousarray(array)
            entries[name] = {"dtype": array.dtype.str, "shape": list(array.shape), "offset": offset}
            digest.update(array.tobytes())
            digest.update(bytes(_pad(array.nbytes)))
            offset += array.nbytes + _pad(array.nbytes)
        header = json.dumps({"info": self.info.to_dict(), "arrays": entries, "data_bytes": offset,
                             "sha256": digest.hexdigest()}).encode()
        header += b" " * _pad(len(MAGIC) + 8 + len(header))
        with atomic_output_file(Path(path)) as tmp:
            with open(tmp, "wb") as f:
                f.write(MAGIC)
                f.write(struct.pack("<Q", len(header)))
                f.write(header)
                for array in arrays.values():
                    f.write(np.ascontiguousarray(array).tobytes())
                    f.write(bytes(_pad(array.nbytes)))

    @classmethod
    def load(cls, path: Path | str, *, verify: bool = True) -> Datastore:
        """Open a datastore file (memory-mapped); a missing, truncated or corrupt file is one ConfigError."""
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"datastore {path} does not exist (build one with `trtspec datastore build`)")
        size = path.stat().st_size
        with open(path, "rb") as f:
            magic = f.read(len(MAGIC))
            if magic != MAGIC:
                raise ConfigError(f"datastore {path} is not a trtspec datastore (its first bytes are {magic[:16]!r})")
            try:
                (length,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(length)) if length < size else None
                info = DatastoreInfo(**{**header["info"], "sources": tuple(header["info"]["sources"])})
                entries, data_bytes = header["arrays"], int(header["data_bytes"])
            except (struct.error, ValueError, TypeError, KeyError) as e:
                raise ConfigError(f"datastore {path}: its header is corrupt ({type(e).__name__})") from None
        start = len(MAGIC) + 8 + length
        if start % ALIGN:
            raise ConfigError(f"datastore {path}: its header is corrupt (the data starts at byte {start}, not on a "
                              f"{ALIGN}-byte boundary)")
        if size != start + data_bytes:
            raise ConfigError(f"datastore {path} is truncated or padded: {size} bytes, its header says "
                              f"{start + data_bytes}")
        try:
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(data_bytes,)) if data_bytes else \
                np.zeros(0, np.uint8)
            if verify and hashlib.sha256(data).hexdigest() != header["sha256"]:
                raise ConfigError(f"datastore {path} is corrupt: its data does not match the SHA-256 in its header")
            arrays = {}
            for name, e in entries.items():
                dtype, shape = np.dtype(e["dtype"]), tuple(e["shape"])
                count = int(np.prod(shape))
                arrays[name] = data[e["offset"]:e["offset"] + count * dtype.itemsize].view(dtype).reshape(shape)
            tokens = arrays["tokens"]
            keys = [arrays[f"keys.{n}"] for n in range(1, info.max_ngram + 1)]
            positions = [arrays[f"positions.{n}"] for n in range(1, info.max_ngram + 1)]
        except (KeyError, ValueError, TypeError) as e:
            raise ConfigError(f"datastore {path}: its arrays are corrupt ({type(e).__name__}: {e})") from None
        return cls(tokens, keys, positions, info, path)

    def check_engine(self, vocab_size: int, tokenizer: str = "", where: str = "datastore") -> None:
        """Refuse a store whose ids the engine cannot take, or one tokenized with another tokenizer (`tokenizer`:
        the engine's tokenizer.json SHA-256, when it has one)."""
        if self.info.vocab_size > vocab_size:
            raise ConfigError(f"{where} {self.path}: built for a vocabulary of {self.info.vocab_size} tokens, the "
                              f"engine has {vocab_size}; rebuild it with this engine's tokenizer")
        if self.info.tokenizer and tokenizer and self.info.tokenizer != tokenizer:
            raise ConfigError(f"{where} {self.path}: tokenized with another tokenizer than the engine's "
                              f"(tokenizer.json SHA-256 {self.info.tokenizer[:12]}, the engine's {tokenizer[:12]}); "
                              "rebuild it with --tokenizer ENGINE_DIR")

    def describe(self) -> dict:
        bytes_ = self.tokens.nbytes + sum(k.nbytes + p.nbytes for k, p in zip(self.keys, self.positions))
        return {**self.info.to_dict(), "path": str(self.path) if self.path else None, "bytes": int(bytes_)}


def _pad(nbytes: int) -> int:
    """Bytes that bring `nbytes` to the next ALIGN boundary."""
    return -nbytes % ALIGN


def _check_max_ngram(max_ngram: int) -> None:
    if isinstance(max_ngram, bool) or not isinstance(max_ngram, int) or not 1 <= max_ngram <= MAX_NGRAM_LIMIT:
        raise ConfigError(f"datastore max_ngram must be an int in 1..{MAX_NGRAM_LIMIT}, got {max_ngram!r}")


def _index(tokens: np.ndarray, max_ngram: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per n, the sorted rolling keys of every n-gram followed by a token, and the position of that token."""
    t = tokens.astype(np.int64)
    length = len(t)
    h = np.zeros(length, np.uint64)  # h[i]: key of the n-gram ending at i - 1 (i.e. followed by position i)
    valid = t != SEPARATOR  # position i is a real token that can be drafted
    keys, positions = [], []
    with np.errstate(over="ignore"):
        for n in range(1, max_ngram + 1):
            prev = np.zeros(length, np.int64) - 1  # the token n places back from i
            prev[n:] = t[:length - n]
            valid = valid & (prev != SEPARATOR)
            h = h * _MULT + (prev + 1).astype(np.uint64)
            at = np.flatnonzero(valid)
            order = np.argsort(h[at], kind="stable")  # equal keys keep position order
            keys.append(h[at][order])
            positions.append(at[order].astype(np.int32 if length < 2**31 else np.int64))
    return keys, positions


def _continuations(tokens: np.ndarray, starts: np.ndarray, depth: int) -> np.ndarray:
    """tokens[start:start + depth] per start, -1 from the first separator (or the end) on."""
    idx = starts[:, None] + np.arange(depth)
    rows = np.where(idx < len(tokens), tokens[np.minimum(idx, len(tokens) - 1)], SEPARATOR).astype(np.int64)
    ended = np.cumsum(rows == SEPARATOR, axis=1) > 0
    rows[ended] = SEPARATOR
    return rows


@dataclass
class RecentOutputs:
    """The server's own recent outputs as a bounded suffix source (SuffixDecoding's global tree, in effect):
    `add` a finished output; when more than 2 x `capacity` tokens are held the oldest outputs are dropped down to
    `capacity` and the index is rebuilt. Shared by every sequence of a generator / engine model (thread-safe)."""

    capacity: int = 32768
    max_ngram: int = DEFAULT_MAX_NGRAM
    min_output: int = 8  # shorter outputs are not worth indexing
    _docs: list[list[int]] = field(default_factory=list, repr=False)
    _held: int = 0
    _tokens: list[int] = field(default_factory=list, repr=False)
    _after: list[dict] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self):
        _check_max_ngram(self.max_ngram)
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, int) or self.capacity < 1:
            raise ConfigError(f"recent outputs capacity must be a positive int, got {self.capacity!r}")
        self._after = [{} for _ in range(self.max_ngram + 1)]

    @property
    def tokens_held(self) -> int:
        return self._held

    def clear(self) -> None:
        with self._lock:
            self._docs, self._held = [], 0
            self._tokens, self._after = [], [{} for _ in range(self.max_ngram + 1)]

    def add(self, output: list[int]) -> None:
        output = [int(t) for t in output]
        if len(output) < self.min_output:
            return
        with self._lock:
            self._docs.append(output)
            self._held += len(output)
            if self._held > 2 * self.capacity:
                while self._held > self.capacity and len(self._docs) > 1:
                    self._held -= len(self._docs.pop(0))
                self._tokens, self._after = [], [{} for _ in range(self.max_ngram + 1)]
                for doc in self._docs:
                    self._append(doc)
            else:
                self._append(output)

    def _append(self, doc: list[int]) -> None:
        seq, after, start = self._tokens, self._after, len(self._tokens)
        seq.extend(doc)
        seq.append(SEPARATOR)
        for j in range(start + 1, start + len(doc)):  # position j follows the n-grams ending at j - 1
            for n in range(1, min(self.max_ngram, j - start) + 1):
                after[n].setdefault(tuple(seq[j - n:j]), []).append(j)

    def lookup(self, context: list[int], *, min_ngram: int = 1, max_ngram: int | None = None,
               max_positions: int = 32, depth: int = 16) -> SuffixMatch:
        top = min(self.max_ngram, max_ngram or self.max_ngram, len(context))
        with self._lock:
            for n in range(top, min_ngram - 1, -1):
                starts = self._after[n].get(tuple(context[-n:]))
                if starts:
                    seq = self._tokens
                    rows = np.full((min(max_positions, len(starts)), depth), SEPARATOR, np.int64)
                    for row, start in zip(rows, starts[-max_positions:]):  # the most recent occurrences
                        cont = seq[start:start + depth]
                        cut = cont.index(SEPARATOR) if SEPARATOR in cont else len(cont)
                        row[:cut] = cont[:cut]
                    return SuffixMatch(n, len(starts), rows)
        return NO_MATCH
