"""Generate the self-distillation data: greedy replies of the base, from its own plain ONNX Runtime engine.

Sequences run with in-flight batching over the engine's batched step; each step's hidden state is the
feature of the token it was fed, so features cost nothing beyond generation itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtspec.errors import ConfigError
from trtspec.progress import StatusBar
from trtspec.train.data import DataCache, load_training_prompts

log = logging.getLogger(__name__)
BATCH = 16  # sequences per step: more buys a small CPU nothing


def build_base_engine(base: Path, work: Path, *, max_input_len: int, max_seq_len: int) -> Path:
    """Convert and build the base into a plain engine under work/ (reused when its profile fits)."""
    from trtspec.checkpoint.convert import ConvertOptions, convert
    from trtspec.engine.manifest import read_manifest
    from trtspec.engine.onnx_builder import BuildOptions, build

    engine = work / "base-engine"
    if (engine / "manifest.json").is_file():
        p = read_manifest(engine).profile
        if p.max_input_len >= max_input_len and p.max_seq_len >= max_seq_len:
            return engine
    ckpt = work / "base-ckpt"
    log.info("building a plain engine of %s for the self-distillation data", base)
    convert(ConvertOptions(base=base, out=ckpt, force=True), show_progress=False)
    build(BuildOptions(source=ckpt, out=engine, no_spec=True, max_batch_size=BATCH, max_input_len=max_input_len,
                       max_seq_len=max_seq_len, force=True))
    return engine


@dataclass
class _Running:
    index: int
    prompt_id: str
    ids: list[int]
    prompt_len: int
    features: list[np.ndarray] = field(default_factory=list)  # [t, H] blocks

    @property
    def new_tokens(self) -> int:
        return len(self.ids) - self.prompt_len


def generate_data(engine_dir: Path, cache: DataCache, *, threads: int | None = None, show_progress: bool = True) -> None:
    """Fill the cache with greedy replies to the spec's prompts (resuming after the sequences already there)."""
    from trtspec.runtime.generator import LocalGenerator

    spec = cache.spec
    gen = LocalGenerator(engine_dir, threads=threads)
    total = cache.needed
    done = {r["id"] for r in cache.rows if r["index"] < total}
    todo = [(i, pid, ids) for i, (pid, ids) in enumerate(_encoded(gen, spec)) if pid not in done]
    start, tokens = time.perf_counter(), 0
    with StatusBar("self-distillation data", total=total, enabled=show_progress) as bar:
        bar.advance(len(done))
        for seq in _run(gen, todo, spec.max_new_tokens):
            cache.append(seq.prompt_id, seq.ids, np.concatenate(seq.features), seq.prompt_len, seq.index)
            tokens += seq.new_tokens
            bar.advance(1, f"{tokens / (time.perf_counter() - start):.0f} tok/s")
    cache.add_generation_seconds(time.perf_counter() - start)
    log.info("self-distillation data: %d sequences, %.1f MiB in %s", len(cache.rows), cache.size_bytes() / 2**20,
             cache.directory)


def _encoded(gen, spec) -> Iterator[tuple[str, list[int]]]:
    """The first samples + eval_samples prompts that fit max_prompt_tokens, as token ids."""
    want, found = spec.samples + spec.eval_samples, 0
    for pid, prompt in load_training_prompts(spec.prompts, 4 * (spec.samples + spec.eval_samples) + 64):
        ids = gen.encode(prompt)
        if len(ids) <= spec.max_prompt_tokens:
            yield pid, ids
            found += 1
            if found == want:
                return
    raise ConfigError(f"--prompts {spec.prompts} has only {found} prompts of at most {spec.max_prompt_tokens} tokens "
                      f"(--max-prompt-tokens); {want} are needed (--samples + --eval-samples)")


def _run(gen, todo: Iterable[tuple[int, str, list[int]]], max_new: int) -> Iterator[_Running]:
    """In-flight batched greedy decoding; yield each sequence as it finishes."""
    engine, end_id = gen.engine, gen.manifest.model.end_id
    queue, active = list(todo)[::-1], {}
    while queue or active:
        while len(active) < BATCH and queue:
            index, prompt_id, ids = queue.pop()
            seq = engine.open()
            out = engine.prefill(seq, np.asarray(ids, np.int64))
            active[seq] = _Running(index, prompt_id, [*ids, int(np.argmax(out.logits[-1]))], len(ids), [out.hidden])
        for seq in [s for s, r in active.items() if r.ids[-1] == end_id or r.new_tokens >= max_new]:
            engine.close(seq)
            yield active.pop(seq)
        if not active:
            continue
        items = [(s, np.array([r.ids[-1]]), np.zeros(1, np.int64), np.ones((1, 1), bool)) for s, r in active.items()]
        for (seq, *_), out in zip(items, engine.verify_batch(items)):
            engine.commit(seq, (0,))
            active[seq].features.append(out.hidden[:1])
            active[seq].ids.append(int(np.argmax(out.logits[0])))
