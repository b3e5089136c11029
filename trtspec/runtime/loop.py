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
from trtspec.runtime.engine import Engine
from trtspec.spec.acceptance import Accepted, accept_greedy, accept_rejection_tree, accept_typical
from trtspec.spec.proposer import Draft, Proposer
from trtspec.spec.sampling import SamplingParams, logits_to_probs, make_rng, sample
from trtspec.spec.stats import SpecStats

ACCEPTANCE_MODES = ("auto", "typical")


@dataclass(frozen=True, kw_only=True)
class GenerationConfig:
    max_tokens: int = 64
    sampling: SamplingParams = SamplingParams()
    end_id: int | None = None
    stop_words: tuple[tuple[int, ...], ...] = ()
    acceptance: str = "auto"  # auto: greedy at T=0, lossless tree rejection sampling at T>0; typical: lossy
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.acceptance not in ACCEPTANCE_MODES:
            raise ConfigError(f"acceptance {self.acceptance!r} is not one of {', '.join(ACCEPTANCE_MODES)}")


@dataclass
class GenerationResult:
    output_ids: list[int]
    finish_reason: str  # "length" | "end_id" | "stop_word"
    stats: SpecStats = field(default_factory=SpecStats)
    ttft_s: float = 0.0
    total_s: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return len(self.output_ids) / self.total_s if self.total_s else 0.0


def generate(engine: Engine, prompt_ids, proposer: Proposer, config: GenerationConfig = GenerationConfig(),
             on_tokens: Callable[[list[int]], None] | None = None) -> GenerationResult:
    """Generate up to config.max_tokens tokens after prompt_ids; stream each step's tokens to on_tokens."""
    prompt = np.asarray(prompt_ids, dtype=np.int64)
    rng = make_rng(config.sampling.seed)
    start = time.perf_counter()
    seq = engine.open()
    try:
        prefill = engine.prefill(seq, prompt)
        root = _pick(prefill.logits[-1], config.sampling, rng)
        result = GenerationResult([], "length", ttft_s=time.perf_counter() - start)
        finish = _emit(result.output_ids, [root], config, on_tokens)
        if finish is None:
            proposer.start(engine, seq, prefill, prompt, root)
        while finish is None:
            draft = proposer.propose(root)
            verify = engine.verify(seq, draft.tokens, draft.tree.position_offsets, draft.tree.mask)
            accepted = _accept(draft, verify.logits, config, rng)
            engine.commit(seq, (0, *accepted.slots))
            result.stats.record(drafted=draft.tree.num_nodes, depth=draft.tree.depth, accepted=accepted.num_accepted)
            finish = _emit(result.output_ids, list(accepted.tokens), config, on_tokens)
            root = accepted.tokens[-1]
            if finish is None:
                proposer.observe(verify, accepted)
        result.finish_reason = finish
    finally:
        engine.close(seq)
    result.total_s = time.perf_counter() - start
    return result


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
