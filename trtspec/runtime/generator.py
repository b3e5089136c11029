"""Local generation over a built engine: prompts → tokens → the speculative loop → text and statistics.

This is what `trtspec generate ENGINE` runs in process; the Triton engine model hosts the same pieces.
Serving path: ONNX Runtime, numpy, tokenizers only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from trtspec.engine.manifest import Method
from trtspec.errors import ConfigError
from trtspec.speculative.loop import GenerationConfig, GenerationResult, Request, generate, generate_batch
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.speculative.datastore import Datastore, RecentOutputs
from trtspec.speculative.tree import DynamicTree
from trtspec.speculative.methods import check_draft_budget, default_lookahead, make_proposer
from trtspec.speculative.ngram_proposer import AcceptanceModel, NgramConfig
from trtspec.speculative.proposer import GivenDraft, Proposer
from trtspec.speculative.tree import build_tree


@dataclass(frozen=True)
class Generation:
    """One prompt's result, as `generate --json` prints it."""

    prompt_index: int
    output_ids: list[int]
    text: str | None
    result: GenerationResult

    def to_dict(self) -> dict:
        s = self.result.stats
        stats = {"steps": s.steps, "draft_tokens": s.draft_tokens, "accepted_tokens": s.accepted_tokens,
                 "acceptance_rate": round(s.acceptance_rate, 4), "acceptance_length": round(s.acceptance_length, 4),
                 "steps_per_profile": {str(k): v for k, v in sorted(s.profile_steps.items())},
                 "ttft_ms": round(self.result.ttft_s * 1000, 2),
                 "tokens_per_second": round(self.result.tokens_per_second, 2)}
        record = {"prompt_index": self.prompt_index, "output_ids": self.output_ids, "text": self.text,
                  "finish_reason": self.result.finish_reason, "stats": stats}
        if self.result.log_probs is not None:
            record["log_probs"] = [round(v, 6) for v in self.result.log_probs]
        return record


class LocalGenerator:
    """An engine dir opened for generation: ONNX Runtime sessions, tokenizer, and the manifest's method."""

    def __init__(self, engine_dir: str | Path, *, threads: int | None = None, spin: bool | None = None,
                 datastore: str | Path | None = None, method: str | None = None, backoff: bool = True,
                 drafter: bool = True, draft_budget: int | None = None):
        """`drafter` False: no request will run the engine's own drafter (OrtEngine's). `draft_budget`: the
        training-free drafters (ngram, suffix, hybrid's n-grams, lookahead) draft at most this many tokens a step
        (None: the engine's K), so one engine serves a smaller budget without a rebuild."""
        self.engine = OrtEngine(engine_dir, threads=threads, spin=spin, drafter=drafter)
        self.manifest = self.engine.manifest
        self.draft_budget = check_draft_budget(draft_budget, self.manifest.profile.max_draft_len)
        self.method = method  # the drafter of requests that name none (None: the manifest's)
        self.backoff = backoff  # False: every request's Medusa / EAGLE / lookahead drafts are whole trees
        self.tokenizer = None
        if self.manifest.tokenizer is not None:
            from trtspec.runtime.tokenizer import Tokenizer

            self.tokenizer = Tokenizer.from_dir(Path(engine_dir) / self.manifest.tokenizer)
        self._tree = build_tree([list(c) for c in self.manifest.tree]) if self.manifest.tree else None
        self.acceptance = AcceptanceModel()  # training-free drafters' acceptance rates, learnt across requests
        self.recent = RecentOutputs()  # method suffix: this generator's recent outputs
        self.datastore = None  # method suffix: the corpus it looks up too
        if datastore is not None:
            self.datastore = Datastore.load(datastore)
            self.datastore.check_engine(self.manifest.model.vocab_size, self._tokenizer_fingerprint(engine_dir))

    def _tokenizer_fingerprint(self, engine_dir) -> str:
        if self.manifest.tokenizer is None:
            return ""
        from trtspec.runtime.tokenizer import tokenizer_fingerprint

        return tokenizer_fingerprint(Path(engine_dir) / self.manifest.tokenizer)

    def proposer(self, config: GenerationConfig = GenerationConfig()) -> Proposer:
        """A drafter for one sequence: config.method (none / ngram / suffix / lookahead / hybrid / the engine's own),
        else this generator's method, else the manifest's; none when config.no_spec; the request's own draft
        when it brought one (config.external_draft)."""
        if config.external_draft is not None:
            return GivenDraft(config.external_draft)
        method = "none" if config.no_spec else config.method or self.method or self.manifest.method.value
        dynamic = DynamicTree(**self.manifest.dynamic_tree) if self.manifest.method is Method.EAGLE2 else None
        ngram, lookahead = config.ngram, config.lookahead
        if self.draft_budget is not None:  # a request's own options win
            ngram = ngram or NgramConfig(max_draft_len=self.draft_budget)
            if method == Method.LOOKAHEAD and lookahead is None:
                lookahead = default_lookahead(self.draft_budget)  # the largest default step the budget holds
                if lookahead is None:
                    raise ConfigError(f"method lookahead: the draft budget {self.draft_budget} holds no lookahead "
                                      "step (the smallest, (W, N, G) = 2,2,1, drafts 2)")
        return make_proposer(method, self.engine, tree=self._tree, dynamic=dynamic, ngram=ngram,
                             acceptance=self.acceptance, datastore=self.datastore, recent=self.recent,
                             lookahead=lookahead, backoff=config.backoff and self.backoff)

    def encode(self, prompt: str | list[dict] | list[int]) -> list[int]:
        """Token ids of a prompt: ids as is; text and chat messages through the tokenizer's chat template."""
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        if self.tokenizer is None:
            raise ConfigError(f"engine {self.engine.engine_dir} has no tokenizer; pass token ids or rebuild with "
                              "--tokenizer DIR")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.tokenizer.encode_chat(messages)

    def stop_words(self, words: list[str]) -> tuple[tuple[int, ...], ...]:
        """Stop strings as token sequences, each tokenized alone as the served preprocessing does."""
        if self.tokenizer is None:
            raise ConfigError(f"engine {self.engine.engine_dir} has no tokenizer for stop strings; rebuild with "
                              "--tokenizer DIR")
        return tuple(tuple(self.tokenizer.encode(w)) for w in words if w)

    def generate_many(self, prompts: list, config: GenerationConfig = GenerationConfig()) -> list[Generation]:
        """All prompts with in-flight batching (up to the manifest's max_batch_size per step)."""
        config = self._with_end_id(config)
        requests = [Request(self._checked_ids(p, config, i), self.proposer(config), config)
                    for i, p in enumerate(prompts)]
        results = generate_batch(self.engine, requests, max_batch_size=self.manifest.profile.max_batch_size)
        return [Generation(i, r.output_ids, self._decode(r.output_ids), r) for i, r in enumerate(results)]

    def replies(self, prompts: list, config: GenerationConfig = GenerationConfig(), *, stream: bool = False,
                on_text: Callable[[int, str], None] | None = None) -> Iterator[Generation]:
        """Each prompt's Generation in order: all at once with in-flight batching, or (stream) one at a time, its
        text passed to on_text(prompt index, piece) as it is generated."""
        if not stream:
            yield from self.generate_many(prompts, config)
            return
        for i, prompt in enumerate(prompts):
            yield self.generate(prompt, config, index=i, on_text=None if on_text is None else partial(on_text, i))

    def generate(self, prompt, config: GenerationConfig = GenerationConfig(), *, index: int = 0,
                 on_text: Callable[[str], None] | None = None) -> Generation:
        config = self._with_end_id(config)
        ids = self._checked_ids(prompt, config, index)
        on_tokens = None
        if on_text is not None and self.tokenizer is not None:
            from trtspec.runtime.tokenizer import IncrementalDecoder

            decoder = IncrementalDecoder(self.tokenizer)
            on_tokens = lambda tokens: on_text(decoder.feed(tokens))  # noqa: E731
        elif on_text is not None:  # an engine without a tokenizer streams token ids, as its replies print them
            sent = []

            def on_tokens(tokens: list[int]) -> None:
                on_text((" " if sent else "") + " ".join(map(str, tokens)))
                sent.extend(tokens)
        result = generate(self.engine, ids, self.proposer(config), config, on_tokens)
        return Generation(index, result.output_ids, self._decode(result.output_ids), result)

    def _decode(self, ids: list[int]) -> str | None:
        return self.tokenizer.decode(ids) if self.tokenizer is not None else None

    def _with_end_id(self, config: GenerationConfig) -> GenerationConfig:
        """config ending at the engine's end id unless it names its own."""
        return config if config.end_id is not None else replace(config, end_id=self.manifest.model.end_id)

    def _checked_ids(self, prompt, config: GenerationConfig, index: int) -> list[int]:
        ids = self.encode(prompt)
        profile = self.manifest.profile
        if len(ids) > profile.max_input_len:
            raise ConfigError(f"prompt {index} has {len(ids)} tokens; the engine's max_input_len is "
                              f"{profile.max_input_len}")
        if len(ids) + config.max_tokens > profile.max_seq_len:
            raise ConfigError(f"prompt {index}: {len(ids)} prompt tokens + max_tokens {config.max_tokens} exceed "
                              f"the engine's max_seq_len {profile.max_seq_len}; lower --max-tokens")
        return ids

