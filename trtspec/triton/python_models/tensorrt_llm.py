# trtspec CPU flavour: the engine model. Hosts the trtspec runtime on ONNX Runtime (Triton Python backend).
# Written by `trtspec deploy`; the logic lives in trtspec.triton.serving (importable and tested without Triton).
# Named `tensorrt_llm` with tensorrtllm_backend's tensor names so clients of a GPU deployment work unchanged.
import os
import site
import sys

for _path in os.environ.get("TRTSPEC_SITE_PACKAGES", "").split(os.pathsep):
    if _path and _path not in sys.path:
        site.addsitedir(_path)  # the serving venv (the stub's embedded interpreter ignores PYTHONPATH)

import itertools  # noqa: E402
import json  # noqa: E402
import threading  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402

from trtspec.errors import TrtspecError  # noqa: E402
from trtspec.runtime.generator import LocalGenerator  # noqa: E402
from trtspec.triton.contract import PERF_METRIC_OUTPUTS  # noqa: E402
from trtspec.triton.serving import (REFUSED_MESSAGE, DrainSignal, EngineService, Job,  # noqa: E402
                                    bool_input, is_stop_request, parse_request, perf_metric_values)
from trtspec.triton.model_args import flag, parameter, repository_path, served_spin  # noqa: E402
from trtspec.triton.text import CONTEXT_TOKENS  # noqa: E402

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
LOG_EVERY_STEPS = 500



PERF_TYPES = {t.name: {"TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP32": np.float32}[t.data_type]
              for t in PERF_METRIC_OUTPUTS}


def _outputs(b: int, ids: list[int], result, finish: str | None, context: list[int], final: bool, item, job,
             generated: int | None = None, key: str = ""):
    """One response for batch item b: `ids` (the last `generated` of them are generated tokens); `key` is the
    request id a `stop` request may name to end this request (postprocessing forwards a cancelled ensemble
    request's key so). Log probabilities and perf metrics only when the request asked for them, as upstream."""
    stats = result.stats
    generated = len(ids) if generated is None else generated
    scalar = lambda v, dtype: np.array([[v]], dtype)  # noqa: E731
    tensors = [
        pb_utils.Tensor("output_ids", np.array([[ids]], np.int32).reshape(1, 1, len(ids))),
        pb_utils.Tensor("sequence_length", scalar(len(ids), np.int32)),
        pb_utils.Tensor("context_ids", np.array([context], np.int32).reshape(1, len(context))),
        pb_utils.Tensor("is_final", scalar(final, np.bool_)),
        pb_utils.Tensor("batch_index", scalar(b, np.int32)),
        pb_utils.Tensor("sequence_index", scalar(0, np.int32)),
        pb_utils.Tensor("num_draft_tokens", scalar(stats.draft_tokens, np.int32)),
        pb_utils.Tensor("num_accepted_tokens", scalar(stats.accepted_tokens, np.int32)),
        pb_utils.Tensor("num_verify_steps", scalar(stats.steps, np.int32)),
        pb_utils.Tensor("steps_per_profile", np.array([[profile_steps(stats)]], np.object_)),
        pb_utils.Tensor("finish_reason", np.array([[(finish or "").encode()]], np.object_)),
        pb_utils.Tensor("stop_request_id", np.array([[key.encode()]], np.object_)),
        pb_utils.Tensor("num_input_tokens", scalar(len(item.prompt_ids), np.int32)),
        pb_utils.Tensor("position_acceptance", np.array([[position_acceptance(stats)]], np.object_)),
    ]
    if item.config.return_log_probs:
        log_probs = result.log_probs[len(result.log_probs) - generated:]
        tensors += [pb_utils.Tensor("cum_log_probs", scalar(sum(result.log_probs), np.float32)),
                    pb_utils.Tensor("output_log_probs", np.array(log_probs, np.float32).reshape(1, 1, generated))]
    if item.return_perf_metrics:
        tensors += [pb_utils.Tensor(name, scalar(value, PERF_TYPES[name]))
                    for name, value in perf_metric_values(job, b, stats).items()]
    return tensors


def profile_steps(stats) -> bytes:
    """The `steps_per_profile` output: {"slots": steps, ...} as JSON, smallest profile first."""
    return json.dumps({str(k): v for k, v in sorted(stats.profile_steps.items())}).encode()


def position_acceptance(stats) -> bytes:
    """The `position_acceptance` output: per draft depth, the steps that drafted it (its parent accepted) and the
    steps that accepted it, as JSON (SpecStats.position_trials / position_hits)."""
    return json.dumps({"trials": list(stats.position_trials), "hits": list(stats.position_hits)}).encode()


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        repo = Path(args["model_repository"]).parent
        engine_dir = repository_path(repo, parameter(config, "engine_dir"))
        threads = int(parameter(config, "threads", "0")) or None
        spin = served_spin(parameter(config, "spin", "auto"))  # auto: the engine's rule (TRTSPEC_ORT_SPIN)
        self.exclude_input = flag(config, "exclude_input_in_output", False)
        datastore = parameter(config, "datastore", "")  # method suffix's corpus (`deploy --datastore`)
        if datastore and not Path(datastore).is_absolute():
            datastore = (repo / datastore).resolve()
        method = parameter(config, "method", "auto")  # auto: the manifest's method
        self.method = None if method == "auto" else method
        self.generator = LocalGenerator(engine_dir, threads=threads, spin=spin, datastore=datastore or None,
                                        method=self.method, backoff=flag(config, "backoff", True),
                                        draft_budget=int(parameter(config, "draft_budget", "0")) or None)
        self.manifest = self.generator.manifest
        batch = int(config.get("max_batch_size") or self.manifest.profile.max_batch_size)
        self._metrics = self._make_metrics(args["model_name"])
        self._published = {key: 0 for key in self._metrics}
        self._metrics_lock = threading.Lock()
        self._stop_publishing = threading.Event()
        self._keys = (f"trtspec-{os.getpid()}-{n}" for n in itertools.count())
        self.generator.proposer()  # an unknown method or one the engine cannot run fails here
        # `trtspec serve --drain-seconds`: before it stops Triton, no new requests, then what is left ends in an error
        drain_file = os.environ.get("TRTSPEC_DRAIN_FILE")
        self.service = EngineService(self.generator.engine, self.generator.proposer,
                                     max_batch_size=min(batch, self.manifest.profile.max_batch_size),
                                     drain=DrainSignal(drain_file) if drain_file else None)
        self._logged_steps = 0
        if self._metrics:
            threading.Thread(target=self._publish_periodically, name="trtspec-metrics", daemon=True).start()
        pb_utils.Logger.log_info(f"trtspec engine {engine_dir} ({self.method or self.manifest.method.value}, K="
                                 f"{self.manifest.profile.max_draft_len}), decoupled={self.decoupled}, "
                                 f"spin={self.generator.engine.spin}")

    def _make_metrics(self, model: str) -> dict:
        """Prometheus counters on Triton's metrics endpoint: how much the engine batches, how much it accepts."""
        counters = {
            "steps": ("trtspec_engine_steps_total", "Verify steps run by the trtspec engine"),
            "sequences": ("trtspec_engine_step_sequences_total", "Sequences in verify steps, summed over steps "
                                                                 "(÷ steps = sequences batched per step)"),
            "draft": ("trtspec_draft_tokens_total", "Draft tokens verified"),
            "accepted": ("trtspec_accepted_draft_tokens_total", "Draft tokens accepted"),
            "cancelled": ("trtspec_requests_cancelled_total", "Prompts ended by a client's cancellation or a stop "
                                                              "request (in flight or still queued)"),
        }
        gauges = {
            "queued": ("trtspec_engine_queue_size", "Prompts waiting for a row of the in-flight batch"),
            "in_flight": ("trtspec_engine_sequences_in_flight", "Sequences in the in-flight batch"),
            "kv_used": ("trtspec_kv_rows_used", "Rows of the engine's KV-cache pool in use (one per sequence)"),
            "kv_free": ("trtspec_kv_rows_free", "Rows of the engine's KV-cache pool free"),
            "last_step_sequences": ("trtspec_engine_last_step_sequences", "Sequences in the last verify step"),
            "last_step_slots": ("trtspec_engine_last_step_slots", "Slot profile of the last verify step "
                                                                  "(1 = plain decoding)"),
        }
        try:
            families = {key: pb_utils.MetricFamily(name=name, description=text, kind=pb_utils.MetricFamily.COUNTER)
                        for key, (name, text) in counters.items()}
            profile = pb_utils.MetricFamily(name="trtspec_engine_profile_steps_total",
                                            description="Verify steps run over each slot profile (slots: 1 = plain)",
                                            kind=pb_utils.MetricFamily.COUNTER)
            gauge_families = {key: pb_utils.MetricFamily(name=name, description=text,
                                                         kind=pb_utils.MetricFamily.GAUGE)
                              for key, (name, text) in gauges.items()}
            # a family must outlive its metrics
            self._metric_families = {**families, **gauge_families, "profile": profile}
            metrics = {key: family.Metric(labels={"model": model}) for key, family in families.items()}
            self._gauges = {key: family.Metric(labels={"model": model}) for key, family in gauge_families.items()}
            for slots in (1, *self.generator.engine.slot_profiles):
                metrics[f"profile_{slots}"] = profile.Metric(labels={"model": model, "slots": str(slots)})
            return metrics
        except Exception as e:  # metrics disabled on this server
            pb_utils.Logger.log_warn(f"trtspec metrics unavailable: {e}")
            self._gauges = {}
            return {}

    def _publish_metrics(self) -> None:
        """Bring the counters up to the scheduler's totals (on a publisher thread, twice a second, and on every
        execute), never on the scheduler thread, which must not wait on the stub's IPC."""
        with self._metrics_lock:
            self._publish_locked()

    def _publish_periodically(self) -> None:
        while not self._stop_publishing.wait(0.5):
            try:
                self._publish_metrics()
            except Exception as e:
                pb_utils.Logger.log_warn(f"trtspec metrics: {e}")
                return

    def _publish_locked(self) -> None:
        service = self.service
        stats = service.stats
        used, rows = self.generator.engine.kv_rows if hasattr(self.generator.engine, "kv_rows") else (0, 0)
        levels = {"queued": service.queued, "in_flight": service.in_flight, "kv_used": used, "kv_free": rows - used,
                  "last_step_sequences": service.last_step[0], "last_step_slots": service.last_step[1]}
        for key, gauge in self._gauges.items():
            gauge.set(levels[key])
        totals = stats.totals()
        for key, metric in self._metrics.items():
            delta = totals.get(key, 0) - self._published[key]
            if delta:
                metric.increment(delta)
                self._published[key] = totals[key]

    def execute(self, requests):
        self._publish_metrics()
        for request in requests:  # decoupled (deploy writes it so): execute returns at once, the scheduler answers
            self._submit_streaming(request)
        self._log_batching()
        return None

    def _inputs(self, request) -> dict:
        return {t.name(): t.as_numpy() for t in request.inputs()}

    def _ids(self, request) -> tuple[str, tuple[str, ...]]:
        """This request's own key and every id a stop request may name (its Triton request id too, as upstream)."""
        key = next(self._keys)
        return key, (key, request.request_id()) if request.request_id() else (key,)

    def _draining(self) -> bool:
        return self.service.drain is not None and self.service.drain.requested()

    def _stop(self, request):
        """A stop request: end the live requests with its id; answered, as upstream, with an empty response."""
        if not request.request_id():
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "stop = true needs the request id of the request to stop (none was given)"))
        self.service.stop(request.request_id())
        return pb_utils.InferenceResponse([])

    def _submit_streaming(self, request):
        sender = request.get_response_sender()
        inputs = self._inputs(request)
        if is_stop_request(inputs):
            sender.send(self._stop(request), flags=FINAL)
            return
        key, ids = self._ids(request)
        in_band = bool_input(inputs, "errors_in_band")  # set by preprocessing: the request comes through the ensemble
        # one response with every prompt's whole output: set by the unary forwarder (`deploy --no-decoupled`), or
        # this model deployed non-decoupled (a rehearsed draft-target pair, which the BLS calls unary)
        unary = not self.decoupled or bool_input(inputs, "one_response")
        if self._draining():
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(REFUSED_MESSAGE)), flags=FINAL)
            return
        try:
            items = parse_request(inputs, self.manifest, default_exclude_input=self.exclude_input,
                                  default_method=self.method)
        except TrtspecError as e:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))), flags=FINAL)
            return
        if unary and any(item.streaming for item in items):
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                "Streaming is only supported in decoupled mode (redeploy with --decoupled)")), flags=FINAL)
            return
        results: dict[int, object] = {}  # unary: batch index → its finished result
        lock = threading.Lock()  # every send and every is_cancelled of this request's sender
        sent: dict[int, list[int]] = {}  # batch index → tokens already streamed
        errors: list[str] = []
        closed = []  # non-empty once the final flag is sent: the sender must not be used after it

        def is_cancelled():  # the watcher thread's poll, never concurrent with a send, never after the final one
            with lock:
                return not closed and sender.is_cancelled()

        def finish_if_last(job):
            # An error travels with the final flag, in one response.
            if job.remaining == 0:
                closed.append(True)
                if errors and in_band and sent:
                    # through the ensemble, after responses: Triton 2.51's ensemble never finishes a request one of
                    # whose steps fails while another is in flight (postprocessing of the responses sent so far),
                    # so the stream just ends; the server log has the reason
                    pb_utils.Logger.log_warn(f"request {key}: {errors[0]}")
                    sender.send(flags=FINAL)
                elif errors:
                    sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(errors[0])), flags=FINAL)
                elif unary:
                    sender.send(pb_utils.InferenceResponse(self._batched_outputs(key, job, results)), flags=FINAL)
                else:
                    sender.send(flags=FINAL)

        def on_progress(b, tokens, result, finish):
            item = items[b]
            if not item.streaming or not tokens:
                return
            before = sent.setdefault(b, [])
            context = before[-CONTEXT_TOKENS:]
            with lock:
                sender.send(pb_utils.InferenceResponse(_outputs(b, tokens, result, finish, context, finish is not None,
                                                                item, job, key=key)))
            before.extend(tokens)

        def on_done(b, result):
            item = items[b]
            with lock:
                if unary:
                    results[b] = result
                elif not item.streaming:  # one response with the whole output
                    ids = (item.echoed if not item.exclude_input_in_output else []) + result.output_ids
                    sender.send(pb_utils.InferenceResponse(_outputs(b, ids, result, result.finish_reason, [], True,
                                                                    item, job, generated=len(result.output_ids),
                                                                    key=key)))
                finish_if_last(job)

        def on_error(b, message):  # the request fails as a whole: its other prompts stop
            with lock:
                errors.append(message if len(items) == 1 else f"prompt {b}: {message}")
                job.stop()
                finish_if_last(job)

        job = Job(items, on_progress, on_done, on_error, is_cancelled=is_cancelled, ids=ids)
        self.service.submit(job)

    def _batched_outputs(self, key: str, job, results) -> list:
        """One response for a whole unary request: every prompt's row ([B, 1, L] ids, [B, 1] scalars), log
        probabilities and perf metrics only when asked for (by any of its prompts)."""
        items = job.items
        rows = [((item.echoed if not item.exclude_input_in_output else []) + results[b].output_ids)
                for b, item in enumerate(items)]
        n = len(rows)
        width = max(len(row) for row in rows)
        pad = self.manifest.model.pad_id or 0
        ids = np.full((n, 1, width), pad, np.int32)
        for b, row in enumerate(rows):
            ids[b, 0, :len(row)] = row
        stats = [results[b].stats for b in range(n)]
        column = lambda values, dtype: np.array(list(values), dtype).reshape(n, 1)  # noqa: E731
        tensors = [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", column([len(row) for row in rows], np.int32)),
            pb_utils.Tensor("context_ids", np.zeros((n, 0), np.int32)),
            pb_utils.Tensor("is_final", column([True] * n, np.bool_)),
            pb_utils.Tensor("batch_index", column(range(n), np.int32)),
            pb_utils.Tensor("sequence_index", column([0] * n, np.int32)),
            pb_utils.Tensor("num_draft_tokens", column([s.draft_tokens for s in stats], np.int32)),
            pb_utils.Tensor("num_accepted_tokens", column([s.accepted_tokens for s in stats], np.int32)),
            pb_utils.Tensor("num_verify_steps", column([s.steps for s in stats], np.int32)),
            pb_utils.Tensor("steps_per_profile", column([profile_steps(s) for s in stats], np.object_)),
            pb_utils.Tensor("finish_reason", column([results[b].finish_reason.encode() for b in range(n)],
                                                    np.object_)),
            pb_utils.Tensor("stop_request_id", column([key.encode()] * n, np.object_)),
            pb_utils.Tensor("num_input_tokens", column([len(item.prompt_ids) for item in items], np.int32)),
            pb_utils.Tensor("position_acceptance", column([position_acceptance(s) for s in stats], np.object_)),
        ]
        if any(item.config.return_log_probs for item in items):
            generated = max(len(results[b].output_ids) for b in range(n))
            log_probs = np.zeros((n, 1, generated), np.float32)
            for b in range(n):
                values = results[b].log_probs or []
                log_probs[b, 0, :len(values)] = values
            tensors += [pb_utils.Tensor("cum_log_probs", column([sum(results[b].log_probs or ()) for b in range(n)],
                                                                np.float32)),
                        pb_utils.Tensor("output_log_probs", log_probs)]
        if any(item.return_perf_metrics for item in items):
            values = [perf_metric_values(job, b, stats[b]) for b in range(n)]
            tensors += [pb_utils.Tensor(name, column([v[name] for v in values], PERF_TYPES[name]))
                        for name in PERF_TYPES]
        return tensors

    def _log_batching(self):
        stats = self.service.stats
        if stats.steps - self._logged_steps >= LOG_EVERY_STEPS:
            self._logged_steps = stats.steps
            pb_utils.Logger.log_info(self._batching_line())

    def _batching_line(self) -> str:
        s = self.service.stats
        return (f"trtspec batching: {s.steps} engine steps, {s.mean_sequences:.2f} sequences per step on average, "
                f"at most {s.max_sequences}")

    def finalize(self):
        self._stop_publishing.set()
        pb_utils.Logger.log_info(self._batching_line())
        self.service.shutdown()
