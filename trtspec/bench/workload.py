"""What `trtspec bench` sends and how: a prompt set's measured prompts, each method's settings and memory, and the
targets that run a group of prompts, in process (`LocalTarget`) or served (`ServedTarget`), one `Timed` per request.

Concurrency C is a closed loop of C users (in process: the in-flight batch of up to C sequences; served: C client
threads, each its own stream). A request rate R is an open loop (served only): Poisson arrivals of R per second from
a seeded generator, as vLLM's serving benchmark sends them. TTFT and latency always count from a request's arrival.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

import numpy as np

from trtspec.errors import ConfigError
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.method import PLAIN
from trtspec.speculative.stats import SpecStats


@dataclass(frozen=True)
class BenchPrompt:
    """One measured prompt: chat messages (served targets send the last one as text) and, in process, its ids."""

    id: str
    category: str
    messages: tuple[dict, ...]
    ids: tuple[int, ...] = ()

    @property
    def text(self) -> str:
        if not self.messages:
            raise ConfigError(f"prompt {self.id} holds token ids (\"input_ids\"); a served run sends text: give the "
                              "prompt as text or messages")
        return self.messages[-1]["content"]


@dataclass
class Timed:
    """One request as a client sees it: its tokens, when they arrived, and the drafter's counters."""

    output_ids: list[int]
    ttft_s: float
    total_s: float
    chunk_s: list[float] = field(default_factory=list)  # arrival of each streamed chunk, from the request's start
    stats: SpecStats = field(default_factory=SpecStats)
    finish_reason: str = ""
    input_tokens: int | None = None  # the prompt's tokens as the server counted them (None: in process, or unknown)

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latency: the gaps between streamed chunks (a speculative step's chunk holds τ tokens)."""
        return [b - a for a, b in zip(self.chunk_s, self.chunk_s[1:])]

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first; None for a one-token reply."""
        n = len(self.output_ids)
        return (self.total_s - self.ttft_s) / (n - 1) if n > 1 else None


def load_bench_prompts(name: str, *, limit: int | None, split: str | None = "measure",
                       generator=None, max_tokens: int = 128, show=print) -> list[BenchPrompt]:
    """A set's first `limit` measured prompts: its measurement split where it has one, else spread across its
    categories (`spreads`: MT-Bench's first 8 are one of each category, not 8 writing prompts); a .jsonl file's in
    order. With an in-process `generator`, their ids too (those that do not fit the engine dropped), and a two-turn
    set's second turn after the engine's plain, greedy first answer. May be empty."""
    from trtspec.data.prompts import PROMPT_SETS, load_prompts, second_turn

    source = PROMPT_SETS.get(name)
    use_split = split if source is not None and source.measure_size else None
    prompts = load_prompts(name, limit=limit, split=use_split, spread=use_split is None and spreads(name))
    limits = None if generator is None else (generator.manifest.profile.max_input_len,
                                             generator.manifest.profile.max_seq_len)
    out = []
    for p in prompts:
        messages, ids = tuple(p.messages), tuple(p.input_ids)  # a JSONL line's token ids, sent as they are
        if not ids and source is not None and source.two_turn:
            if generator is None:
                raise ConfigError(f"--prompt-set {name}: a two-turn set needs the engine's own first answers; "
                                  "measure it in process (ENGINE_DIR), or use its first turns (mt-bench)")
            first = generator.generate(list(messages), GenerationConfig(max_tokens=max_tokens, no_spec=True))
            messages = tuple(second_turn(p, first.text))
        if not ids and generator is not None:
            ids = tuple(generator.encode(list(messages)))
        if generator is None or fits(p.id, len(ids), max_tokens, limits, show):
            out.append(BenchPrompt(p.id, p.category, messages, ids))
    return out


def fits(prompt_id: str, tokens: int, max_tokens: int, limits: tuple[int, int], show,
         engines: str = "the engine") -> bool:
    """Whether a prompt of `tokens` tokens and its reply fit `limits`, the engines' (max_input_len, max_seq_len)
    (else one line says it is skipped)."""
    if tokens > limits[0] or tokens + max_tokens > limits[1]:
        show(f"  {prompt_id}: {tokens} prompt tokens + {max_tokens} do not fit {engines} "
             f"(max_input_len {limits[0]}, max_seq_len {limits[1]}); skipped")
        return False
    return True


def spreads(name: str) -> bool:
    """Whether `load_bench_prompts` spreads a set across its categories (a known set of several, without a split)."""
    from trtspec.data.prompts import PROMPT_SETS

    source = PROMPT_SETS.get(name)
    return source is not None and not source.measure_size and len(source.categories) > 1


def method_configs(base: GenerationConfig, methods) -> dict[str, GenerationConfig]:
    """Plain decoding and each method as `base` for one request: `spec` is the deployment's own drafter, and
    `METHOD:full` runs METHOD's whole tree every step (no back-off)."""
    configs = {PLAIN: replace(base, no_spec=True)}
    for label in methods:
        method, _, whole = label.partition(":")
        configs[label] = replace(base, method=None if method == "spec" else method,
                                 backoff=base.backoff and whole != "full")
    return configs


def method_memory(labels, keep: dict | None = None) -> dict:
    """In process, each method its own recent outputs (suffix and hybrid never draft from another method's answer
    to the same prompt) and acceptance model (how much ngram and suffix draft; `keep`'s, when given)."""
    from trtspec.speculative.datastore import RecentOutputs
    from trtspec.speculative.ngram_proposer import AcceptanceModel

    return {label: (RecentOutputs(), keep[label][1] if keep else AcceptanceModel()) for label in labels}


def use_memory(generator, memory: dict, label: str) -> None:
    if memory:  # none for a served target
        generator.recent, generator.acceptance = memory[label]


class LocalTarget:
    """An engine folder opened in this process."""

    def __init__(self, generator):
        self.generator = generator
        self.own_method = generator.manifest.method.value
        self.max_batch_size = generator.manifest.profile.max_batch_size

    def describe(self) -> str:
        return str(self.generator.engine.engine_dir)

    def run(self, prompts: list[BenchPrompt], options: GenerationConfig, concurrency: int) -> tuple[list[Timed], float]:
        """Every prompt through the in-flight batch of `concurrency` sequences; (one record each, wall seconds)."""
        from trtspec.speculative.loop import Request, generate_batch

        if concurrency > self.max_batch_size:
            raise ConfigError(f"--concurrency {concurrency} exceeds the engine's max_batch_size "
                              f"{self.max_batch_size}; rebuild with --max-batch-size {concurrency}")
        config = replace(options, end_id=self.generator.manifest.model.end_id)
        clocks = [_ChunkClock() for _ in prompts]
        requests = [Request(list(p.ids), self.generator.proposer(options), config, clock.tick)
                    for p, clock in zip(prompts, clocks)]
        start = time.perf_counter()
        results = generate_batch(self.generator.engine, requests, max_batch_size=concurrency)
        wall = time.perf_counter() - start
        waits = _queue_waits(start, [(c.times[0] - r.ttft_s if c.times else start, r.total_s)
                                     for r, c in zip(results, clocks)], concurrency)
        return [Timed(r.output_ids, r.ttft_s + wait, r.total_s + wait, clock.since(r.ttft_s + wait), r.stats,
                      r.finish_reason) for r, clock, wait in zip(results, clocks, waits)], wall


def _queue_waits(start: float, runs: list[tuple[float, float]], concurrency: int) -> list[float]:
    """How long each request waited between arriving and its own prefill starting (`runs`: each one's prefill start
    and seconds from there to its end), which a served client counts and the loop's clock leaves out. The first
    `concurrency` requests arrive at `start`, request C + k when the k-th to finish frees its row; sequences joining
    at once prefill one after another."""
    finishes = sorted(begin + total for begin, total in runs)
    arrivals = [start if i < concurrency else finishes[i - concurrency] for i in range(len(runs))]
    return [max(0.0, begin - arrival) for (begin, _), arrival in zip(runs, arrivals)]


class _ChunkClock:
    """The arrival times of a request's streamed chunks (`on_tokens`), the first being its first token."""

    def __init__(self):
        self.times: list[float] = []

    def tick(self, tokens) -> None:
        self.times.append(time.perf_counter())

    def since(self, ttft_s: float) -> list[float]:
        """The times relative to the request's start, given that the first chunk came at ttft_s."""
        return [ttft_s + (t - self.times[0]) for t in self.times]


class ServedTarget:
    """A deployed ensemble over gRPC streaming (trtspec's CPU flavour takes --method and speculation off)."""

    def __init__(self, url: str, *, model: str = "ensemble", timeout_s: float = 600.0):
        from trtspec.triton.client import TritonClient

        self.url, self.model, self.timeout_s = url, model, timeout_s
        with TritonClient(url, model=model, timeout_s=timeout_s) as client:
            client.check_ready(wait_s=5.0)
        self.own_method = None  # what the deployment runs when no method is asked for
        self.max_batch_size = None

    def describe(self) -> str:
        return f"{self.url} ({self.model})"

    def run(self, prompts: list[BenchPrompt], options: GenerationConfig, concurrency: int) -> tuple[list[Timed], float]:
        """Every prompt by `concurrency` client threads, each its own connection; (one record each, wall seconds)."""
        from trtspec.triton.client import generate_concurrently

        start = time.perf_counter()
        out = generate_concurrently(self.url, prompts, concurrency=concurrency, model=self.model,
                                    timeout_s=self.timeout_s,
                                    send=lambda client, i: _served_one(client, prompts[i], options))
        return _raised(out), time.perf_counter() - start

    def run_open(self, prompts: list[BenchPrompt], options: GenerationConfig, rate: float,
                 seed: int = 0) -> tuple[list[Timed], float]:
        """Every prompt at its Poisson arrival, `rate` per second on average (gaps drawn with `seed`); one record
        each, timed from its arrival, and the wall seconds from the first arrival to the last reply."""
        import queue

        from trtspec.triton.client import TritonClient

        gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(prompts))
        arrivals = np.cumsum(gaps) - gaps[0]  # the first request at once
        idle: queue.SimpleQueue = queue.SimpleQueue()  # connections whose last request has finished
        clients: list = []
        out: list[Timed | BaseException | None] = [None] * len(prompts)

        def send(i: int, due: float) -> None:
            client = None
            try:
                try:
                    client = idle.get_nowait()
                except queue.Empty:
                    client = TritonClient(self.url, model=self.model, timeout_s=self.timeout_s)
                    clients.append(client)
                sent = time.perf_counter()  # after its arrival (a new connection, a busy client): that wait counts
                out[i] = _delayed(_served_one(client, prompts[i], options), max(0.0, sent - due))
            except BaseException as e:  # raised below, in the caller's thread
                out[i] = e
            finally:
                if client is not None:
                    idle.put(client)

        start = time.perf_counter()
        senders = []
        for i, at in enumerate(arrivals):
            time.sleep(max(0.0, start + at - time.perf_counter()))
            senders.append(threading.Thread(target=send, args=(i, start + at)))
            senders[-1].start()
        for t in senders:
            t.join()
        wall = time.perf_counter() - start
        for client in clients:
            client.close()
        return _raised(out), wall


def _raised(results: list) -> list:
    """`results`, unless one is an exception (a request's, from its thread): the first is raised here."""
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def _delayed(timed: Timed, wait_s: float) -> Timed:
    """`timed` as seen from a request's arrival `wait_s` seconds before it was sent."""
    return replace(timed, ttft_s=timed.ttft_s + wait_s, total_s=timed.total_s + wait_s,
                   chunk_s=[t + wait_s for t in timed.chunk_s])


def _served_one(client, prompt: BenchPrompt, options: GenerationConfig) -> Timed:
    chunks: list[float] = []
    start = time.perf_counter()
    remote = client.generate(prompt.text, options, on_text=lambda piece: chunks.append(time.perf_counter() - start))
    stats = SpecStats(steps=remote.steps, draft_tokens=remote.draft_tokens, accepted_tokens=remote.accepted_tokens,
                      profile_steps={int(k): v for k, v in remote.steps_per_profile.items()},
                      position_trials=list(remote.position_trials), position_hits=list(remote.position_hits))
    if chunks and remote.ttft_s:
        chunks[0] = remote.ttft_s  # the first token's arrival, as the client measured it (its text may come later)
    return Timed(remote.output_ids, remote.ttft_s, remote.total_s, chunks, stats, remote.finish_reason,
                 remote.input_tokens)
