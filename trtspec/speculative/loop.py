"""The speculative loop: draft → verify K+1 slots → accept → commit, until a stop condition.

Engine-agnostic: it drives any `Engine` with any `Proposer`. At temperature 0 acceptance is greedy and the
output equals plain greedy decoding of the same engine token for token; at temperature > 0 the tree
rejection rule keeps the target distribution (Medusa's typical acceptance is the one lossy option).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.engine import BatchedEngine, CostedEngine, Engine, StepOutput
from trtspec.speculative.acceptance import Accepted, accept_greedy, accept_rejection_tree, accept_typical
from trtspec.speculative.lookahead_proposer import LookaheadConfig
from trtspec.speculative.ngram_proposer import NgramConfig
from trtspec.speculative.penalties import Penalties, apply_penalties, token_counts
from trtspec.speculative.proposer import Draft, Proposer, observe_one_by_one
from trtspec.speculative.sampling import SamplingParams, logits_to_probs, make_rng, sample, softmax
from trtspec.speculative.stats import SpecStats

ACCEPTANCE_MODES = ("auto", "typical")


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    """One request's generation settings, the same from the CLI and the gRPC client to this loop and the Triton
    engine model: its sampling, limits, stop rules and drafter.

    The loop reads the sampling, limits and stop rules; whoever builds the request's proposer (LocalGenerator, the
    engine model) reads the drafter fields. end_id None stops at no end id here; LocalGenerator and the engine
    model fill in the engine's."""

    max_tokens: int = 128
    sampling: SamplingParams = SamplingParams()
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    acceptance: str = "auto"  # auto: greedy at T=0, lossless tree rejection sampling at T>0; typical: lossy
    return_log_probs: bool = False  # log p(token) of every emitted token under the target's sampling distribution
    min_tokens: int = 0  # end_id is banned until this many tokens have been generated
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never generated (the last token is banned after the rest)
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token, bias) added to every step's logits (TensorRT-LLM's embedding_bias)
    penalties: Penalties = Penalties()  # repetition / presence / frequency, over the prompt and output (penalties.py)
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    # the drafter
    no_spec: bool = False  # speculation off: plain decoding of the same engine
    method: str | None = None  # none, ngram, suffix, lookahead, hybrid or the engine's own; None: the deployment's
    ngram: NgramConfig | None = None  # methods ngram / suffix: their options (None: the defaults)
    lookahead: LookaheadConfig | None = None  # method lookahead: (W, N, G) (None: the engine's, or one fitting K)
    backoff: bool = True  # Medusa / EAGLE / lookahead: shrink or rest drafts that do not pay (False: the full tree)
    # draft tokens sent with the request (TensorRT-LLM's draft_input_ids, from a draft-target pair's loop): the
    # continuation of the prompt, verified once; the request ends with its accepted prefix and one token of the
    # target's own (1 .. len + 1 tokens), its proposer a GivenDraft of them
    external_draft: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.acceptance not in ACCEPTANCE_MODES:
            raise ConfigError(f"acceptance {self.acceptance!r} is not one of {', '.join(ACCEPTANCE_MODES)}")


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: str  # "length" | "end_id" | "stop_word" | "cancelled"
    stats: SpecStats = field(default_factory=SpecStats)
    ttft_s: float = 0.0
    total_s: float = 0.0
    log_probs: list[float] | None = None  # one per output id, when config.return_log_probs
    @property
    def tokens_per_second(self) -> float:
        return len(self.output_ids) / self.total_s if self.total_s else 0.0


@dataclass
class Request:
    """One sequence to generate: its prompt, its drafter, its limits, and where its tokens stream to."""

    prompt_ids: object
    proposer: Proposer
    config: GenerationConfig = GenerationConfig()
    on_tokens: Callable[[list[int]], None] | None = None
    cancelled: Callable[[], bool] | None = None  # polled between steps (a client that went away)
    # called after every emission with (new tokens, the result so far, finish reason or None): servers stream
    # from it with the acceptance counters of the step that produced the tokens
    on_progress: Callable[[list[int], GenerationResult, str | None], None] | None = None


class _Decoding:
    """One sequence in flight: prefill once, then draft → (batched) verify → accept → commit per step."""

    def __init__(self, engine: Engine, request: Request):
        self.engine, self.request, self.config = engine, request, request.config
        self.rng = make_rng(self.config.sampling.seed)
        self.start = time.perf_counter()
        self.result = GenerationResult([], "length", log_probs=[] if self.config.return_log_probs else None)
        self.seq = engine.open()
        self.finish: str | None = None
        self.draft: Draft | None = None
        prompt = np.asarray(request.prompt_ids, dtype=np.int64)
        self.counts: np.ndarray | None = None  # each token's occurrences in prompt + output, when penalized
        try:
            prefill = engine.prefill(self.seq, prompt)
            if self.config.penalties.active:
                self.counts = token_counts(prompt, prefill.logits.shape[-1])
            logits = _constrain(prefill.logits[-1:], [], None, None, self.config, self.counts)
            self.root = _pick(logits[0], self.config.sampling, self.rng)
            self.result.ttft_s = time.perf_counter() - self.start
            self._emit([self.root], logits)
            given = self.config.external_draft
            if given is not None and self.finish is None and (not given or given[0] != self.root):
                self.finish = "length"  # the draft's first token already rejected: nothing left to verify
            if self.finish is None:
                request.proposer.start(engine, self.seq, prefill, prompt, self.root)
        except BaseException:
            self.close()
            raise

    def propose(self) -> Draft:
        start = time.perf_counter()
        self.draft = self.request.proposer.propose(self.root)
        self.result.stats.draft_s += time.perf_counter() - start
        return self.draft

    def advance(self, verify: StepOutput) -> tuple[StepOutput, Accepted] | None:
        """Accept against the verify output of self.draft, commit, emit; return what the drafter must observe
        (the verify output and the accepted path), or None when the sequence finished."""
        draft = self.draft
        logits = _constrain(verify.logits, self.result.output_ids, draft.tokens, draft.tree, self.config,
                            self.counts)
        accepted = _accept(draft, logits, self.config, self.rng)
        self.engine.commit(self.seq, (0, *accepted.slots))
        self.result.stats.record(drafted=draft.tree.num_nodes, depth=draft.tree.depth, accepted=accepted.num_accepted,
                                 slots=verify.slots)
        self._emit(list(accepted.tokens), logits, [0, *accepted.slots])
        if self.config.external_draft is not None:
            self.finish = self.finish or "length"  # a given draft is verified once
        self.root = accepted.tokens[-1]
        return (verify, accepted) if self.finish is None else None

    def _emit(self, tokens: list[int], logits: np.ndarray, rows: list[int] | None = None) -> None:
        """Emit tokens; logits[rows[j]] (rows None: logits[j]) is the row that produced tokens[j] (for log
        probabilities; the rows are gathered only then: a plain step would copy its logits row for nothing)."""
        before = len(self.result.output_ids)
        self.finish = _emit(self.result.output_ids, tokens, self.config, self.request.on_tokens)
        if self.counts is not None:
            np.add.at(self.counts, self.result.output_ids[before:], 1)
        if self.result.log_probs is not None:
            taken = len(self.result.output_ids) - before
            produced = logits if rows is None else logits[rows]
            self.result.log_probs += _log_probs(produced[:taken], tokens[:taken], self.config.sampling)
        if self.request.on_progress is not None:
            self.request.on_progress(self.result.output_ids[before:], self.result, self.finish)

    def close(self) -> GenerationResult:
        self.engine.close(self.seq)
        finish = getattr(self.request.proposer, "finish", None)  # drafters that learn from finished outputs
        if finish is not None:
            finish(self.result.output_ids)
        self.result.finish_reason = self.finish or "length"
        self.result.total_s = time.perf_counter() - self.start
        return self.result


def generate(engine: Engine, prompt_ids, proposer: Proposer, config: GenerationConfig = GenerationConfig(),
             on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
    """Generate up to config.max_tokens tokens after prompt_ids; stream each step's tokens to on_tokens."""
    return generate_batch(engine, [Request(prompt_ids, proposer, config, on_tokens)], max_batch_size=1)[0]


def generate_batch(engine: Engine, requests: list[Request], *, max_batch_size: int = 8) -> list[GenerationResult]:
    """In-flight batching: up to max_batch_size sequences share each verify step; a sequence joins as soon as
    another leaves. Each sequence keeps its own drafter and tree; the engine pads a step's drafts to the smallest
    slot profile that holds the largest of them.
    Results come back in request order and equal what `generate` gives each request alone."""
    queue = list(enumerate(requests))[::-1]
    results: list[GenerationResult | None] = [None] * len(requests)
    with InflightBatch(engine, max_batch_size) as batch:
        while queue or batch.active:
            while queue and batch.has_room:
                batch.add(*queue.pop())
            for index, result in batch.step():
                results[index] = result
    return results


class InflightBatch:
    """The sequences in flight on one engine: `add` prefills a sequence (it joins the next step), `step` runs
    one batched draft → verify → accept → commit over all of them and returns those that finished.

    A request whose `cancelled()` turns true leaves before the next step with finish reason "cancelled".
    Not thread-safe: one thread drives it (the Triton engine model runs it on its scheduler thread).
    """

    def __init__(self, engine: Engine, max_batch_size: int):
        self.engine, self.max_batch_size = engine, max_batch_size
        self.active: list[tuple[object, _Decoding]] = []
        self.last_slots = 0  # the slot profile the last step ran over (0: no step yet, or not reported)

    @property
    def has_room(self) -> bool:
        return len(self.active) < self.max_batch_size

    def add(self, key, request: Request) -> None:
        """Prefill the request's prompt (its first token streams now); it verifies from the next step on."""
        if not self.has_room:
            raise RuntimeError("InflightBatch is full")
        self.active.append((key, _Decoding(self.engine, request)))

    def step(self) -> list[tuple[object, GenerationResult]]:
        """One verify step over every unfinished sequence; return (key, result) of each sequence that finished."""
        done = self._drain_finished()
        if self.active:
            drafts = [d.propose() for _, d in self.active]
            if len(drafts) > 1:
                drafts = _fit_batch(self.engine, [d for _, d in self.active], drafts)
            outputs = _verify_all(self.engine, [d.seq for _, d in self.active], drafts)
            self.last_slots = max(o.slots for o in outputs)
            steps = [(decoding, decoding.advance(output)) for (_, decoding), output in zip(self.active, outputs)]
            _observe_all([(decoding, step) for decoding, step in steps if step is not None])
            done += self._drain_finished()
        return done

    def _drain_finished(self) -> list[tuple[object, GenerationResult]]:
        for _, decoding in self.active:
            cancelled = decoding.request.cancelled
            if decoding.finish is None and cancelled is not None and cancelled():
                decoding.finish = "cancelled"
        done = [(key, decoding.close()) for key, decoding in self.active if decoding.finish is not None]
        self.active = [a for a in self.active if a[1].finish is None]
        return done

    def close(self) -> None:
        """Free every sequence still in flight (after an error)."""
        for _, decoding in self.active:
            self.engine.close(decoding.seq)
        self.active = []

    def __enter__(self) -> InflightBatch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _observe_all(steps: list[tuple[_Decoding, tuple[StepOutput, Accepted]]]) -> None:
    """Let each drafter see its step; drafters of a kind that can observe a batch at once (`observe_batch`,
    e.g. one EAGLE draft run for every sequence) do so together. The time goes to each sequence's draft_s (a
    batched observation's, shared evenly)."""
    kinds: dict[type, list] = {}
    for decoding, step in steps:
        kinds.setdefault(type(decoding.request.proposer), []).append((decoding, step))
    for kind, group in kinds.items():
        proposers, kind_steps = [d.request.proposer for d, _ in group], [s for _, s in group]
        start = time.perf_counter()
        if len(group) > 1 and hasattr(kind, "observe_batch"):
            kind.observe_batch(proposers, kind_steps)
        else:
            observe_one_by_one(proposers, kind_steps)
        share = (time.perf_counter() - start) / len(group)
        for decoding, _ in group:
            decoding.result.stats.draft_s += share


# a drafting batch step's cost beyond its graph run, as a share of it (acceptance, commit and drafter updates per
# row), chosen where batched speculation's budget matched plain batched decoding best (docs/results.md)
BATCH_DRAFT_OVERHEAD = 0.1


def _fit_batch(engine: Engine, decodings: list[_Decoding], drafts: list[Draft]) -> list[Draft]:
    """Shrink the drafts of an in-flight batch to the slot profile worth most to the batch as a whole.

    Every row of a batched step pays for the batch's profile, and a batch's slots cost far more than one sequence's,
    so each row's own budget (made against the one-sequence curve) is only an upper bound: the step takes the
    profile T that maximises the batch's expected tokens per unit of its cost, and drafts that carry node
    probabilities keep their T - 1 most probable nodes. Drafts without them (static trees) keep their size, which
    bounds T from below; their rows count the acceptance length they have had so far."""
    if not isinstance(engine, CostedEngine) or all(d.node_p is None for d in drafts):
        return drafts
    costs = engine.step_costs()
    floor = max((d.tree.num_nodes + 1 for d in drafts if d.node_p is None), default=1)
    gains = [np.concatenate([[0.0], np.cumsum(np.sort(d.node_p)[::-1])]) if d.node_p is not None else None
             for d in drafts]
    fixed = sum(d.result.stats.acceptance_length or 1.0 for d, g in zip(decodings, gains) if g is None)
    widest = max(d.tree.num_nodes + 1 for d in drafts)
    best, best_value = widest, -1.0
    for slots in costs.profiles:
        if slots < floor or slots > costs.profile_for(max(widest, floor)):
            continue
        tokens = fixed + sum(1.0 + g[min(slots - 1, len(g) - 1)] for g in gains if g is not None)
        # each drafting row's bookkeeping (acceptance, commit, its drafter's update) is paid on top of the graph
        value = tokens / (costs.batch_cost(len(drafts), slots) * (1.0 + BATCH_DRAFT_OVERHEAD * (slots > 1)))
        if value > best_value + 1e-9:
            best, best_value = slots, value
    out = []
    for decoding, draft in zip(decodings, drafts):
        if draft.node_p is not None and draft.tree.num_nodes > best - 1:
            draft = decoding.request.proposer.shrink(best - 1)
            decoding.draft = draft
        out.append(draft)
    return out


def _verify_all(engine: Engine, seqs: list[int], drafts: list[Draft]) -> list[StepOutput]:
    """One batched verify step when the engine has one, else one call per sequence."""
    items = [(seq, d.tokens, d.tree.position_offsets, d.tree.mask) for seq, d in zip(seqs, drafts)]
    if len(items) > 1 and isinstance(engine, BatchedEngine):
        return engine.verify_batch(items)
    return [engine.verify(*item) for item in items]


def _constrain(logits: np.ndarray, output: list[int], draft_tokens, tree, config: GenerationConfig,
               counts: np.ndarray | None = None) -> np.ndarray:
    """Apply the logit bias, the penalties (`counts`: the prompt's and output's tokens, None when there are none),
    min_tokens and bad_words to the rows of one step, each in its own context: row i predicts the token after tree
    node i, i.e. after `output` plus the draft tokens on the path to node i. The same rule applies to the accepted
    path as plain decoding applies to each token, so speculation stays lossless."""
    masks = bool(config.bad_words) or len(output) + (tree.depth if tree is not None else 0) < config.min_tokens
    if not config.logit_bias and counts is None and not masks:
        return logits
    logits = np.array(logits, dtype=np.float32, copy=True)
    if config.logit_bias:  # the same for every row: verifying a draft sees what plain decoding would
        tokens, values = zip(*config.logit_bias)
        logits[:, list(tokens)] += np.asarray(values, np.float32)
    if counts is None and not masks:
        return logits
    paths = [_path(draft_tokens, tree, i) for i in range(1 if tree is None else tree.num_nodes + 1)]
    if counts is not None:  # after the bias, as TensorRT-LLM's penalty kernel
        apply_penalties(logits, counts, paths, config.penalties, config.sampling.temperature)
    if not masks:
        return logits
    for i, path in enumerate(paths):
        context = output + path
        if len(context) < config.min_tokens and config.end_id is not None:
            logits[i, config.end_id] = -np.inf
        for word in config.bad_words:
            if len(word) == 1 or (len(context) >= len(word) - 1 and tuple(context[len(context) - len(word) + 1:]) == word[:-1]):
                logits[i, word[-1]] = -np.inf
    return logits


def _path(draft_tokens, tree, node: int) -> list[int]:
    """The draft tokens from the root's first child down to `node` (empty for the root, or without a tree)."""
    path = []
    while tree is not None and node > 0:
        path.append(int(draft_tokens[node]))
        node = int(tree.parents[node])
    return path[::-1]


def _log_probs(logits: np.ndarray, tokens: list[int], params: SamplingParams) -> list[float]:
    """log p(token) under the distribution the token is drawn from: the raw softmax when greedy (as
    TensorRT-LLM reports it), else after temperature, top-k and top-p."""
    if not tokens:
        return []
    rows = np.asarray(logits, np.float64)
    probs = softmax(rows) if params.greedy else logits_to_probs(rows, params)
    picked = probs[np.arange(len(tokens)), tokens]
    with np.errstate(divide="ignore"):
        return np.log(picked).tolist()


def _pick(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator) -> int:
    return int(np.argmax(logits)) if params.greedy else sample(logits_to_probs(logits, params), rng)


def _accept(draft: Draft, logits: np.ndarray, config: GenerationConfig, rng: np.random.Generator) -> Accepted:
    """The acceptance rule in one place: greedy at T=0, else lossless tree rejection (or lossy typical)."""
    if config.sampling.greedy:
        return accept_greedy(draft.tokens, logits, draft.tree.paths)
    if config.acceptance == "typical":
        return accept_typical(draft.tokens, logits, draft.tree.paths, temperature=config.sampling.temperature,
                              posterior_threshold=config.posterior_threshold,
                              posterior_alpha=config.posterior_alpha, rng=rng)
    return accept_rejection_tree(draft.tokens, logits_to_probs(logits, config.sampling), draft.tree.children, rng)


def _emit(output: list[int], tokens: list[int], config: GenerationConfig,
          on_tokens: Callable[[list[int]], None] | None) -> str | None:
    """Append tokens until a stop condition; return the finish reason, or None to go on."""
    finish, taken = None, 0
    for token in tokens:
        output.append(token)
        taken += 1
        if config.end_id is not None and token == config.end_id:
            finish = "end_id"
        elif any(len(output) >= len(w) and tuple(output[-len(w):]) == w for w in config.stop_words):
            finish = "stop_word"
        elif len(output) >= config.max_tokens:
            finish = "length"
        if finish:
            break
    if on_tokens is not None and taken:
        on_tokens(tokens[:taken])
    return finish
