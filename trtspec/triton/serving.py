"""What the CPU flavour's engine model does, without Triton: parse a request's tensors, run the speculative loop
with in-flight batching across requests on one scheduler thread, and report tokens as they come.

The tensor names are those of tensorrtllm_backend's `tensorrt_llm` model (input_ids, input_lengths,
request_output_len, runtime_top_k, streaming, ...), so clients that talk to that model directly work too. Each
request may carry a batch of B prompts; every prompt becomes its own sequence in the batcher, and its responses
carry `batch_index`. Inputs the CPU engine cannot honour (beam search, logits outputs)
are refused for that request with a message naming the tensor and value, never silently ignored.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from trtspec.engine.manifest import Manifest
from trtspec.errors import ConfigError, TrtspecError
from trtspec.speculative.loop import GenerationConfig, GenerationResult, InflightBatch, Request
from trtspec.speculative.lookahead_proposer import LookaheadConfig
from trtspec.speculative.penalties import Penalties
from trtspec.speculative.proposer import Proposer
from trtspec.triton.contract import LOOKAHEAD_INPUTS
from trtspec.speculative.sampling import SamplingParams
from trtspec.triton.text import decode_word_list
from trtspec.triton.drain import DrainSignal  # noqa: F401  (serve's side imports it from there: no numpy)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ItemRequest:
    """One prompt of a request, ready for the loop."""

    prompt_ids: list[int]
    config: GenerationConfig  # use_speculation, draft_method and lookahead_* are its no_spec, method and lookahead
    streaming: bool = False
    exclude_input_in_output: bool = False
    echo_ids: list[int] | None = None  # what an echo shows in place of prompt_ids (the client's text, not the template)
    return_perf_metrics: bool = False  # send tensorrt_llm's perf-metric outputs

    @property
    def echoed(self) -> list[int]:
        """The ids a reply with exclude_input_in_output = false starts with."""
        return self.prompt_ids if self.echo_ids is None else self.echo_ids


def _scalar(inputs: dict[str, np.ndarray], name: str, b: int, default):
    value = inputs.get(name)
    if value is None or value.size == 0:
        return default
    flat = np.asarray(value).reshape(value.shape[0], -1) if value.ndim else value.reshape(1, 1)
    row = flat[b] if flat.shape[0] > b else flat[0]
    if not row.size:
        return default
    item = row[0]
    return item.item() if isinstance(item, np.generic) else item  # BYTES tensors hold Python bytes


def _first(inputs: dict[str, np.ndarray], names: tuple[str, ...], b: int, default):
    for name in names:
        if name in inputs:
            return _scalar(inputs, name, b, default)
    return default


# Upstream tensorrt_llm inputs the CPU engine cannot honour: a request that sends one is refused in one line naming
# it (tensorrtllm_backend v0.19.0 tensorrt_llm/config.pbtxt lists them; the ensemble passes the client's on).
REFUSED_INPUTS = {
    **dict.fromkeys(("encoder_input_features", "encoder_output_lengths", "cross_attention_mask",
                     "skip_cross_attn_blocks"), "encoder-decoder models"),
    **dict.fromkeys(("mrope_rotary_cos_sin", "mrope_position_deltas"), "multimodal rotary embeddings"),
    **dict.fromkeys(("draft_logits", "draft_acceptance_threshold"),
                    "draft logits (drafts sent with draft_input_ids are accepted by token match)"),
    **dict.fromkeys(("prompt_embedding_table", "prompt_table_extra_ids", "prompt_table_extra_id", "prompt_vocab_size"),
                    "prompt tuning"),
    **dict.fromkeys(("lora_task_id", "lora_weights", "lora_config"), "LoRA adapters"),
    "context_phase_params": "disaggregated serving",
    **dict.fromkeys(("retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
                     "retention_token_range_durations_ms", "retention_decode_priority",
                     "retention_decode_duration_ms"), "KV-cache retention (the CPU pool reuses no blocks)"),
    **dict.fromkeys(("guided_decoding_guide_type", "guided_decoding_guide"), "guided decoding"),
    **dict.fromkeys(("runtime_top_p_min", "runtime_top_p_decay", "runtime_top_p_reset_ids"), "top-p decay"),
}


def refuse_unsupported(inputs: dict[str, np.ndarray]) -> None:
    """ConfigError naming the first input of REFUSED_INPUTS the request sends."""
    for name, what in REFUSED_INPUTS.items():
        if name in inputs:
            raise ConfigError(f"{name}: {what} is not supported by the trtspec CPU engine")


def sampling_params(temperature: float | None, top_k: int | None, top_p: float | None,
                    seed: int | None) -> SamplingParams:
    """TensorRT-LLM's sampling semantics for a request's (temperature, top_k, top_p), a field left out taking the
    executor's default: top_k 0 and top_p 0 (tensorrtllm_backend utils.cc `getSamplingConfigFromTensors` leaves
    both unset, a top_p <= 0 too) and temperature 1. top_k 0 with top_p 0 is greedy (TensorRT-LLM's top-k / top-p
    setup kernels set k = 1 for it, cpp/tensorrt_llm/kernels/samplingTopKKernels.cu), as is top_k 1; trtspec also
    takes temperature <= 0 as greedy. Otherwise top-k and / or top-p sampling at the temperature (top_p 0 meaning
    no nucleus cut)."""
    temperature = 1.0 if temperature is None else float(temperature)
    top_k = 0 if top_k is None else int(top_k)
    top_p = 0.0 if top_p is None or top_p <= 0 else float(top_p)
    greedy = temperature <= 0 or top_k == 1 or (top_k == 0 and top_p == 0.0)
    if greedy:
        return SamplingParams(temperature=0.0, top_k=0, top_p=1.0, seed=seed)
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p or 1.0, seed=seed)


def is_stop_request(inputs: dict[str, np.ndarray]) -> bool:
    """tensorrtllm_backend's `stop` input: a request with stop = true ends the live requests that carry its request
    id (its other inputs are ignored) and gets one empty final response (`handleStopRequest` in upstream's
    inflight_batcher_llm/src/model_instance_state.cc)."""
    return bool_input(inputs, "stop")


def bool_input(inputs: dict[str, np.ndarray], name: str) -> bool:
    """A request-level BOOL input (its first element); false when absent."""
    return name in inputs and bool(_scalar(inputs, name, 0, False))


def parse_request(inputs: dict[str, np.ndarray], manifest: Manifest, *, default_exclude_input: bool = False,
                  default_method: str | None = None) -> list[ItemRequest]:
    """The engine model's input tensors (leading batch dimension B) → one ItemRequest per prompt.

    Raises ConfigError naming the tensor and the value for anything the engine cannot serve.
    """
    if "input_ids" not in inputs:
        raise ConfigError("input_ids is required")
    refuse_unsupported(inputs)
    decoder = np.asarray(inputs.get("decoder_input_ids", np.zeros((1, 1))))
    if decoder.size > max(decoder.shape[:1] or (1,)):
        # more than one decoder token per prompt; upstream's preprocessing sends [B, 1] of pad_id for a decoder-only
        # model, and that one is accepted
        raise ConfigError("decoder_input_ids: encoder-decoder models are not supported by the trtspec CPU engine")
    ids = np.asarray(inputs["input_ids"])
    ids = ids.reshape(1, -1) if ids.ndim == 1 else ids.reshape(ids.shape[0], -1)
    batch = ids.shape[0]
    if "request_output_len" not in inputs:
        raise ConfigError("request_output_len (the ensemble's max_tokens) is required")
    profile = manifest.profile
    items = []
    for b in range(batch):
        length = int(_scalar(inputs, "input_lengths", b, ids.shape[1]))
        if not 0 < length <= ids.shape[1]:
            raise ConfigError(f"input_lengths[{b}] = {length} is outside 1..{ids.shape[1]} (the input_ids width)")
        prompt = [int(t) for t in ids[b, :length]]
        vocab = manifest.model.vocab_size
        bad = next((i for i, t in enumerate(prompt) if not 0 <= t < vocab), None)
        if bad is not None:
            raise ConfigError(f"input_ids[{b}][{bad}] = {prompt[bad]} is not a token id of this engine "
                              f"(its vocabulary is 0..{vocab - 1})")
        max_tokens = int(_scalar(inputs, "request_output_len", b, 0))
        if max_tokens <= 0:
            raise ConfigError(f"max_tokens must be > 0, got {max_tokens}")
        if length > profile.max_input_len:
            raise ConfigError(f"the prompt has {length} tokens; the engine's max_input_len is {profile.max_input_len}")
        if length + max_tokens > profile.max_seq_len:
            raise ConfigError(f"{length} prompt tokens + max_tokens {max_tokens} exceed the engine's max_seq_len "
                              f"{profile.max_seq_len}")
        for name, default, allowed in (("beam_width", 1, (1,)), ("num_return_sequences", 1, (1,)),
                                       ("return_context_logits", False, (False,)),
                                       ("return_generation_logits", False, (False,))):
            value = _scalar(inputs, name, b, default)
            if value not in allowed:
                raise ConfigError(f"{name} = {value} is not supported by the trtspec CPU engine "
                                  f"(supported: {', '.join(map(str, allowed))})")
        bad_words = decode_word_list(inputs["bad_words_list"][b]) if "bad_words_list" in inputs else ()
        min_tokens = int(_first(inputs, ("min_tokens", "min_length"), b, 0))
        if min_tokens < 0:
            raise ConfigError(f"min_tokens must be >= 0, got {min_tokens}")
        stop_words = decode_word_list(inputs["stop_words_list"][b]) if "stop_words_list" in inputs else ()
        end_id = _scalar(inputs, "end_id", b, None)
        end_id = manifest.model.end_id if end_id is None or end_id < 0 else int(end_id)
        seed = _first(inputs, ("random_seed", "seed"), b, None)
        try:
            sampling = sampling_params(_scalar(inputs, "temperature", b, None),
                                       _first(inputs, ("runtime_top_k", "top_k"), b, None),
                                       _first(inputs, ("runtime_top_p", "top_p"), b, None),
                                       None if seed is None else int(seed))
        except ConfigError as e:
            raise ConfigError(f"{e}") from None
        external = _external_draft(inputs, b, manifest)
        method = _scalar(inputs, "draft_method", b, None)
        method = method.decode(errors="replace") if isinstance(method, bytes) else method
        if method:
            from trtspec.triton.deploy_options import check_method

            check_method(manifest, method, what="draft_method")
        config = GenerationConfig(max_tokens=max_tokens, sampling=sampling, end_id=end_id, stop_words=stop_words,
                                  return_log_probs=bool(_scalar(inputs, "return_log_probs", b, False)),
                                  min_tokens=min_tokens, bad_words=bad_words,
                                  logit_bias=_logit_bias(inputs, b, manifest.model.vocab_size),
                                  penalties=Penalties(float(_scalar(inputs, "repetition_penalty", b, 1.0)),
                                                      float(_scalar(inputs, "presence_penalty", b, 0.0)),
                                                      float(_scalar(inputs, "frequency_penalty", b, 0.0))),
                                  no_spec=not _scalar(inputs, "use_speculation", b, True), method=method or None,
                                  lookahead=_lookahead(inputs, b, manifest, method or default_method),
                                  external_draft=external)
        items.append(ItemRequest(
            prompt, config,
            streaming=bool(_first(inputs, ("streaming", "stream"), b, False)),
            exclude_input_in_output=bool(_scalar(inputs, "exclude_input_in_output", b, default_exclude_input)),
            echo_ids=_echo_ids(inputs, b),
            return_perf_metrics=bool(_scalar(inputs, "return_perf_metrics", b, False))))
    return items


def _external_draft(inputs: dict[str, np.ndarray], b: int, manifest: Manifest) -> tuple[int, ...] | None:
    """tensorrt_llm's `draft_input_ids` ([B, k]: a draft model's next k tokens after the prompt, as a draft-target
    loop sends them, tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py): verified once, the first against the
    prefill's own token, the other k - 1 as one chain, so k - 1 may not exceed the engine's max_draft_len."""
    if "draft_input_ids" not in inputs:
        return None
    ids = np.asarray(inputs["draft_input_ids"])
    row = ids.reshape(ids.shape[0], -1)[b if ids.shape[0] > b else 0] if ids.ndim else ids.reshape(1)
    draft = tuple(int(t) for t in row)
    vocab = manifest.model.vocab_size
    bad = next((i for i, t in enumerate(draft) if not 0 <= t < vocab), None)
    if bad is not None:
        raise ConfigError(f"draft_input_ids[{b}][{bad}] = {draft[bad]} is not a token id of this engine "
                          f"(its vocabulary is 0..{vocab - 1})")
    if len(draft) - 1 > manifest.profile.max_draft_len:
        raise ConfigError(f"draft_input_ids[{b}] has {len(draft)} tokens; this engine verifies at most "
                          f"{manifest.profile.max_draft_len + 1} (its max_draft_len {manifest.profile.max_draft_len} "
                          "after its own first token)")
    return draft


def _logit_bias(inputs: dict[str, np.ndarray], b: int, vocab: int) -> tuple[tuple[int, float], ...]:
    """tensorrt_llm's `embedding_bias` ([B, vocab] added to the logits of every step; [B, 0] for none) as sparse
    (token, bias) pairs."""
    if "embedding_bias" not in inputs:
        return ()
    bias = np.asarray(inputs["embedding_bias"], np.float32)
    bias = bias.reshape(bias.shape[0], -1) if bias.ndim else bias.reshape(1, 1)
    row = bias[b] if bias.shape[0] > b else bias[0]
    if row.size == 0:
        return ()
    if row.size != vocab:
        raise ConfigError(f"embedding_bias has {row.size} values per prompt; the engine's vocabulary has {vocab}")
    if np.isnan(row).any():
        raise ConfigError("embedding_bias holds NaN")
    nonzero = np.flatnonzero(row)
    return tuple((int(t), float(row[t])) for t in nonzero)


def _echo_ids(inputs: dict[str, np.ndarray], b: int) -> list[int] | None:
    """preprocessing's ECHO_IDS for prompt b ([B, L] padded with -1; width 0: the prompt is the client's text)."""
    if "echo_ids" not in inputs:
        return None
    echo = np.asarray(inputs["echo_ids"])
    echo = echo.reshape(echo.shape[0], -1) if echo.ndim else echo.reshape(1, 1)
    if echo.shape[1] == 0:
        return None
    row = echo[b] if echo.shape[0] > b else echo[0]
    return [int(t) for t in row if t >= 0]


def _lookahead(inputs: dict[str, np.ndarray], b: int, manifest, method: str | None) -> LookaheadConfig | None:
    """A request's lookahead_window_size / _ngram_size / _verification_set_size, the rest from the engine's (W, N, G)
    or the default that fits its K; checked against both. None when it sends none of them."""
    given = {name: _scalar(inputs, name, b, None) for name in LOOKAHEAD_INPUTS}
    if all(v is None for v in given.values()):
        return None
    if (method or manifest.method.value) != "lookahead":
        raise ConfigError("lookahead_window_size / _ngram_size / _verification_set_size configure draft_method "
                          "lookahead; send draft_method \"lookahead\" too")
    from trtspec.speculative.methods import default_lookahead

    own = LookaheadConfig(**manifest.lookahead) if manifest.lookahead else None
    base = default_lookahead(manifest.profile.max_draft_len, own) or LookaheadConfig(2, 2, 1)
    values = {name.removeprefix("lookahead_"): getattr(base, name.removeprefix("lookahead_")) if v is None else int(v)
              for name, v in given.items()}
    config = LookaheadConfig(**values)
    config.check_fits(manifest.profile.max_draft_len, own, where="lookahead_*")
    return config


@dataclass(eq=False)
class Job:
    """One Triton request: its prompts and where their progress goes (all called on the scheduler thread).

    A job ends early when it is stopped: by a `stop` request naming one of its `ids` (tensorrtllm_backend's way
    to end a request), or when `is_cancelled` (Triton's per-request cancellation, an IPC call to the server) turns
    true. `is_cancelled` is polled by the service's watcher thread, never by the scheduler, which only reads the
    `stopped` flag between steps."""

    items: list[ItemRequest]
    # (batch index, new tokens, result so far, finish reason or None when more will come)
    on_progress: Callable[[int, list[int], GenerationResult, str | None], None]
    on_done: Callable[[int, GenerationResult], None]  # a prompt finished (after its last progress)
    on_error: Callable[[int, str], None]  # a prompt failed; it gets nothing more
    is_cancelled: Callable[[], bool] | None = None
    ids: tuple[str, ...] = ()  # the request ids a stop request may name (Triton's request id, trtspec's own key)
    stopped: bool = False
    failure: str | None = None  # why a stopped job ends in an error rather than as "cancelled"
    remaining: int = field(init=False)
    # tensorrt_llm's timing metrics on the server's monotonic clock (ns; TensorRT-LLM's steady_clock): when the
    # request arrived, and per prompt when it joined the batch, its first and its last token
    arrival_ns: int = field(default_factory=time.monotonic_ns)
    times: dict[int, list[int]] = field(init=False)

    def __post_init__(self):
        self.remaining = len(self.items)
        self.times = {b: [0, 0, 0] for b in range(len(self.items))}

    def stop(self, failure: str | None = None) -> None:
        self.stopped = True
        self.failure = self.failure or failure

    def cancelled(self) -> bool:
        return self.stopped


# What tensorrt_llm's kv_cache_* perf metrics count on the CPU engine: its KV pool holds one row of max_seq_len
# positions per sequence, allocated when the sequence joins the batch and never shared, so a request allocates one
# "block" (that row), reuses none, and holds one in all (docs/triton-contract.md).
KV_BLOCKS_PER_SEQUENCE = 1


def perf_metric_values(job: Job, b: int, stats) -> dict[str, int | float]:
    """tensorrt_llm's perf-metric outputs for prompt b of job, by name (contract.PERF_METRIC_OUTPUTS), so far."""
    scheduled, first, last = job.times.get(b, (0, 0, 0))
    drafted, accepted = stats.draft_tokens, stats.accepted_tokens
    return {"kv_cache_alloc_new_blocks": KV_BLOCKS_PER_SEQUENCE, "kv_cache_reused_blocks": 0,
            "kv_cache_alloc_total_blocks": KV_BLOCKS_PER_SEQUENCE,
            "arrival_time_ns": job.arrival_ns, "first_scheduled_time_ns": scheduled,
            "first_token_time_ns": first, "last_token_time_ns": last,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "total_accepted_draft_tokens": accepted, "total_draft_tokens": drafted}


@dataclass
class BatchingStats:
    steps: int = 0
    sequences: int = 0  # summed over steps: sequences in each verify step
    max_sequences: int = 0
    draft_tokens: int = 0  # of finished sequences
    accepted_tokens: int = 0
    cancelled: int = 0  # prompts ended by a cancellation or a stop request (in flight or still queued)
    profile_steps: dict[int, int] = field(default_factory=dict)  # slot profile → verify steps run over it
    # record() runs on the scheduler thread, totals() on the metrics publisher: a step is counted whole or not at
    # all (a publication between the two increments showed one step more than the profiles summed up to)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, active: int, slots: int = 0) -> None:
        with self._lock:
            self.steps += 1
            if slots:
                self.profile_steps[slots] = self.profile_steps.get(slots, 0) + 1
            self.sequences += active
            self.max_sequences = max(self.max_sequences, active)

    def totals(self) -> dict[str, int]:
        """The counters as Prometheus publishes them, one consistent snapshot."""
        with self._lock:
            return {"steps": self.steps, "sequences": self.sequences, "draft": self.draft_tokens,
                    "accepted": self.accepted_tokens, "cancelled": self.cancelled,
                    **{f"profile_{slots}": n for slots, n in self.profile_steps.items()}}

    @property
    def mean_sequences(self) -> float:
        return self.sequences / self.steps if self.steps else 0.0


DRAIN_MESSAGE = "the server is shutting down (its drain time is over)"
REFUSED_MESSAGE = "the server is shutting down; it takes no new requests"

IDLE_DRAIN_POLL_S = 0.1  # an idle engine model with a drain file to watch looks at it this often
CANCEL_POLL_S = 0.02  # how often the watcher asks Triton whether a live request was cancelled (about a decode step)


class EngineService:
    """One engine, one scheduler thread, in-flight batching of every prompt of every submitted job.

    A watcher thread polls each live job's `is_cancelled` (as tensorrtllm_backend's C++ model polls its response
    factories) and stops it; the scheduler drops a stopped job's sequences before the next step, frees their KV
    rows and reports them finished with reason "cancelled", and a stopped job still queued never starts."""

    def __init__(self, engine, make_proposer: Callable[[GenerationConfig], Proposer],
                 max_batch_size: int,
                 cancel_poll_s: float = CANCEL_POLL_S, drain: DrainSignal | None = None):
        self.engine, self.make_proposer = engine, make_proposer
        self.batch = InflightBatch(engine, max_batch_size)
        self.stats = BatchingStats()
        self._pending: collections.deque[tuple[Job, int]] = collections.deque()
        self._wake = threading.Condition()
        self._stopping = False
        self._live: dict[Job, None] = {}  # submitted and not finished, in submission order (guarded by _wake)
        self._cancel_poll_s = cancel_poll_s
        self._work = threading.Event()  # set while there are live jobs to watch: an idle server polls nothing
        self.drain = drain  # polled by the watcher
        self.last_step = (0, 0)  # (sequences, slot profile) of the last verify step
        self._thread = threading.Thread(target=self._run, name="trtspec-scheduler", daemon=True)
        self._thread.start()
        self._watcher = threading.Thread(target=self._watch_cancellations, name="trtspec-cancel-watcher",
                                         daemon=True)
        self._watcher.start()

    @property
    def queued(self) -> int:
        """Prompts waiting for a row in the batch."""
        return len(self._pending)

    @property
    def in_flight(self) -> int:
        """Sequences in the batch."""
        return len(self.batch.active)

    def submit(self, job: Job) -> None:
        with self._wake:
            if not job.items:
                return
            self._live[job] = None
            self._pending.extend((job, i) for i in range(len(job.items)))
            self._wake.notify()
            self._work.set()

    def stop(self, request_id: str) -> int:
        """A stop request (tensorrtllm_backend's `stop` input): end every live job with this id; how many."""
        with self._wake:
            jobs = [job for job in self._live if request_id in job.ids]
            for job in jobs:
                job.stop()
            if jobs:
                self._wake.notify()
        return len(jobs)

    def end_all(self, message: str) -> int:
        """End every live job not ended yet with an error response (the server's drain time is over); how many."""
        with self._wake:
            jobs = [job for job in self._live if not job.stopped]
            for job in jobs:
                job.stop(failure=message)
            self._wake.notify()
        return len(jobs)

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
            self._work.set()
        self._thread.join(timeout)

    def _watch_cancellations(self) -> None:
        while True:
            if self.drain is not None and self.drain.requested():
                if self.drain.over() and self.end_all(DRAIN_MESSAGE):
                    log.warning("drain time over: ending the requests in flight")
                with self._wake:
                    idle = not self._live
                if idle:
                    self.drain.report_idle()
            with self._wake:
                if self._stopping:
                    return
                jobs = [job for job in self._live if job.is_cancelled is not None and not job.stopped]
                idle = not self._live
                if idle:
                    self._work.clear()  # under the lock: a submit after this sets it again
            if idle:  # nothing to watch: sleep until a request comes (a drain file is looked at now and then)
                self._work.wait(None if self.drain is None else IDLE_DRAIN_POLL_S)
                continue
            cancelled = []
            for job in jobs:
                try:
                    if job.is_cancelled():
                        cancelled.append(job)
                except Exception:  # a request whose state cannot be read any more has no one waiting for it
                    log.debug("is_cancelled failed", exc_info=True)
                    cancelled.append(job)
            if cancelled:
                with self._wake:
                    for job in cancelled:
                        job.stop()
                    self._wake.notify()
            time.sleep(self._cancel_poll_s)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._pending and not self.batch.active and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    break
                dropped = [entry for entry in self._pending if entry[0].stopped]
                if dropped:  # cancelled while queued: they never start
                    self._pending = collections.deque(entry for entry in self._pending if not entry[0].stopped)
                joining = []
                while self._pending and len(joining) + len(self.batch.active) < self.batch.max_batch_size:
                    joining.append(self._pending.popleft())
            for job, index in dropped:
                self._finish(job, index, GenerationResult([], "cancelled"))
            for job, index in joining:
                self._join(job, index)
            if not self.batch.active:
                continue
            active = len(self.batch.active)
            self.batch.last_slots = 0  # a verify sets it; still 0 after step(): every sequence had finished before it
            try:
                done = self.batch.step()
            except Exception as e:  # an engine failure fails the sequences in flight, not the server
                log.exception("engine step failed")
                for (job, index), _ in self.batch.active:
                    self._fail(job, index, f"engine step failed: {e}")
                self.batch.close()
                continue
            if self.batch.last_slots:  # a step that only handed back finished sequences verified nothing
                self.stats.record(active, self.batch.last_slots)
                self.last_step = (active, self.batch.last_slots)
            for (job, index), result in done:
                self._finish(job, index, result)
        for (job, index), _ in self.batch.active:
            self._fail(job, index, "the server is shutting down")
        self.batch.close()
        with self._wake:
            pending, self._pending = list(self._pending), collections.deque()
        for job, index in pending:
            self._fail(job, index, "the server is shutting down")

    def _join(self, job: Job, index: int) -> None:
        item = job.items[index]
        if job.cancelled():
            self._finish(job, index, GenerationResult([], "cancelled"))
            return

        job.times[index][0] = time.monotonic_ns()

        def progress(tokens: list[int], result: GenerationResult, finish: str | None) -> None:
            if tokens:
                times = job.times[index]
                times[2] = time.monotonic_ns()
                times[1] = times[1] or times[2]
            try:
                job.on_progress(index, tokens, result, finish)
            except Exception:  # a response that cannot be sent must not stop the other sequences
                log.exception("sending a response failed")

        request = Request(item.prompt_ids, self.make_proposer(item.config), item.config, cancelled=job.cancelled, on_progress=progress)
        try:
            self.batch.add((job, index), request)
        except TrtspecError as e:
            self._fail(job, index, str(e))
        except Exception as e:
            log.exception("prefill failed")
            self._fail(job, index, f"prefill failed: {e}")

    def _ended(self, job: Job) -> None:
        job.remaining -= 1
        if job.remaining == 0:
            with self._wake:
                self._live.pop(job, None)

    def _finish(self, job: Job, index: int, result: GenerationResult) -> None:
        if job.failure is not None:
            self._fail(job, index, job.failure)
            return
        self.stats.draft_tokens += result.stats.draft_tokens
        self.stats.accepted_tokens += result.stats.accepted_tokens
        if result.finish_reason == "cancelled":
            self.stats.cancelled += 1
        self._ended(job)
        try:
            job.on_done(index, result)
        except Exception:
            log.exception("sending a response failed")

    def _fail(self, job: Job, index: int, message: str) -> None:
        self._ended(job)
        try:
            job.on_error(index, message)
        except Exception:
            log.exception("sending an error response failed")
