"""Self-distillation data: the base model's own greedy replies to training prompts, with its final hidden states.

The base is converted and built into a plain ONNX Runtime engine (the same engine trtspec serves), prompts run
with in-flight batching, and every sequence is streamed to disk as it finishes: token ids (int32) and, for
every position but the last, the post-final-norm hidden state that predicts the next token (the Medusa heads'
input and the EAGLE feature), in float16. The cache resumes where it stopped and is reused by both trainers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trtspec.errors import ConfigError

log = logging.getLogger(__name__)

# never train on what trtspec measures with. (sharegpt-grounded's prompts are sharegpt prompts too: 5 of its 40
# measurement prompts are among the first 272 a default sharegpt training run reads; docs/prompt-sets.md)
EVALUATION_SETS = ("mt-bench", "mt-bench-2turn", "humaneval", "code-edit", "sharegpt-grounded")
COUNTS = ("samples", "eval_samples")  # settings a cache may differ in
SPEC_FILE, INDEX_FILE, TOKENS_FILE, FEATURES_FILE = "data.json", "index.jsonl", "tokens.i32", "features.f16"
TIMING_FILE = "timing.json"  # wall-clock seconds spent generating, summed over runs


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """What the cached data was generated from; a cache is reused only when its spec is equal."""

    base: str  # resolved base folder
    prompts: str  # prompt set name or resolved .jsonl path
    samples: int  # training sequences
    eval_samples: int  # held-out sequences (the prompts after the training ones)
    max_new_tokens: int
    max_prompt_tokens: int

    def __post_init__(self):
        if Path(self.prompts).stem in EVALUATION_SETS or self.prompts in EVALUATION_SETS:
            raise ConfigError(f"--prompts {self.prompts} is an evaluation set (it measures the drafters)"
                              "; train on sharegpt, champ or your own .jsonl file")
        for name in ("samples", "max_new_tokens", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.eval_samples < 1:
            raise ConfigError(f"--eval-samples must be >= 1, got {self.eval_samples}")


@dataclass(frozen=True)
class Sample:
    """One cached sequence: ids [n + 1] (prompt then reply) and features [n, H] (row i predicts ids[i + 1])."""

    ids: np.ndarray
    features: np.ndarray
    prompt_len: int


class DataCache:
    """The on-disk cache: data.json (spec), index.jsonl (one line per finished sequence), two flat arrays."""

    def __init__(self, directory: Path, spec: DataSpec, hidden_size: int):
        self.directory, self.spec, self.hidden = Path(directory), spec, hidden_size
        self.rows = self._open()

    def _open(self) -> list[dict]:
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        spec_path = d / SPEC_FILE
        if spec_path.is_file():
            # sequence i is the reply to the i-th usable prompt whatever the counts: a cache grows or shrinks
            # with --samples / --eval-samples, any other setting needs new data
            stored = json.loads(spec_path.read_text())
            differs = sorted(k for k, v in asdict(self.spec).items() if stored.get(k) != v and k not in COUNTS)
            if differs:
                raise ConfigError(f"{d} holds data generated with other settings ({', '.join(differs)}: "
                                  f"{spec_path}); pass another --data folder or delete it")
        spec_path.write_text(json.dumps(asdict(self.spec), indent=2) + "\n")
        rows = [json.loads(line) for line in (d / INDEX_FILE).read_text().splitlines()] \
            if (d / INDEX_FILE).is_file() else []
        # a run stopped mid-write leaves bytes past the last indexed sequence: cut them off
        tokens = sum(r["length"] for r in rows)
        features = sum(r["length"] - 1 for r in rows)
        for name, size in ((TOKENS_FILE, 4 * tokens), (FEATURES_FILE, 2 * self.hidden * features)):
            with open(d / name, "ab") as f:
                f.truncate(size)
        return rows

    @property
    def needed(self) -> int:
        return self.spec.samples + self.spec.eval_samples

    @property
    def complete(self) -> bool:
        return {r["index"] for r in self.rows} >= set(range(self.needed))

    def append(self, prompt_id: str, ids: list[int], features: np.ndarray, prompt_len: int, index: int) -> None:
        """Stream one finished sequence to disk; the index line is written last, so it marks completeness."""
        assert features.shape == (len(ids) - 1, self.hidden), (features.shape, len(ids))
        with open(self.directory / TOKENS_FILE, "ab") as f:
            f.write(np.asarray(ids, np.int32).tobytes())
        with open(self.directory / FEATURES_FILE, "ab") as f:
            f.write(np.asarray(features, np.float16).tobytes())
        row = {"id": prompt_id, "index": index, "length": len(ids), "prompt_len": prompt_len}
        with open(self.directory / INDEX_FILE, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.rows.append(row)

    def samples(self) -> tuple[list[Sample], list[Sample]]:
        """(training, held-out) sequences, memory-mapped."""
        if not self.complete:
            have = len({r["index"] for r in self.rows} & set(range(self.needed)))
            raise ConfigError(f"{self.directory} holds {have} of the {self.needed} sequences needed; run again to "
                              "finish it")
        n_tok = sum(r["length"] for r in self.rows)
        tokens = np.memmap(self.directory / TOKENS_FILE, np.int32, "r", shape=(n_tok,))
        feats = np.memmap(self.directory / FEATURES_FILE, np.float16, "r", shape=(n_tok - len(self.rows), self.hidden))
        out, t, f = {}, 0, 0
        for r in self.rows:  # stored in the order sequences finished; `index` is the prompt order
            n = r["length"]
            out[r["index"]] = Sample(tokens[t:t + n], feats[f:f + n - 1], r["prompt_len"])
            t, f = t + n, f + n - 1
        return [out[i] for i in range(self.spec.samples)], [out[i] for i in range(self.spec.samples, self.needed)]

    @property
    def generation_seconds(self) -> float:
        path = self.directory / TIMING_FILE
        return json.loads(path.read_text())["generation_seconds"] if path.is_file() else 0.0

    def add_generation_seconds(self, seconds: float) -> None:
        total = self.generation_seconds + seconds
        (self.directory / TIMING_FILE).write_text(json.dumps({"generation_seconds": round(total, 1)}) + "\n")

    def size_bytes(self) -> int:
        return sum((self.directory / n).stat().st_size for n in (TOKENS_FILE, FEATURES_FILE))


def check_prompt_source(name: str) -> str:
    """A prompt set name or a .jsonl path, resolved; evaluation sets are refused."""
    if name in EVALUATION_SETS:
        raise ConfigError(f"--prompts {name} is an evaluation set (it measures the drafters); "
                          "train on sharegpt, champ or your own .jsonl file")
    from trtspec.data.prompts import PROMPT_SETS, refuse_non_jsonl_file

    if name in PROMPT_SETS:
        return name
    if name.endswith(".jsonl"):
        path = Path(name)
        if not path.is_file():
            raise ConfigError(f"prompt file {path} does not exist")
        return str(path.resolve())
    refuse_non_jsonl_file(name, "--prompts")
    raise ConfigError(f"unknown prompt set {name!r}; train on sharegpt, champ or a .jsonl file")


def load_training_prompts(source: str, count: int) -> Iterator[tuple[str, object]]:
    """(id, prompt) pairs: chat messages, or the token ids of a .jsonl line that holds "input_ids"."""
    from trtspec.data.prompts import load_prompts

    for p in load_prompts(source, limit=count):
        yield p.id, list(p.input_ids) or list(p.messages)
