"""The engine model's scheduler without Triton: stop requests and cancellations end a request within a step, free
its KV row, and a cancelled request still queued never starts; other requests are untouched."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig, generate
from trtspec.triton.serving import DRAIN_MESSAGE, DrainSignal, EngineService, ItemRequest, Job, is_stop_request

TIMEOUT = 60


@pytest.fixture(scope="module")
def generator(tiny_engine):
    return LocalGenerator(tiny_engine, threads=1)


def _service(generator, max_batch_size=4, **kwargs):
    return EngineService(generator.engine, generator.proposer,
                         max_batch_size=max_batch_size, **kwargs)


class Recorder:
    """A job's callbacks: progress calls per prompt, results, errors, and an event when every prompt ended."""

    def __init__(self, items, **job_kwargs):
        self.progress, self.results, self.errors = {}, {}, {}
        self.ended = threading.Event()
        self.on_first = None  # called at the first progress report (the prefill's token)
        self.on_second = None  # called at the second (inside the first verify step)
        self.job = Job(items, self._progress, self._done, self._error, **job_kwargs)

    def _progress(self, b, tokens, result, finish):
        self.progress[b] = self.progress.get(b, 0) + 1
        if self.progress[b] == 1 and self.on_first:
            self.on_first()
        if self.progress[b] == 2 and self.on_second:
            self.on_second()

    def _end(self):
        if len(self.results) + len(self.errors) == len(self.job.items):
            self.ended.set()

    def _done(self, b, result):
        self.results[b] = result
        self._end()

    def _error(self, b, message):
        self.errors[b] = message
        self._end()


def _item(prompt=(5, 6, 7), max_tokens=100):
    return ItemRequest(list(prompt), GenerationConfig(max_tokens=max_tokens), streaming=True)


def _wait_until(condition, timeout=TIMEOUT) -> bool:
    """Whether `condition()` turned true within `timeout` s: waits for another thread (the watcher, the scheduler)
    to act; the timeout only catches a hang."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def test_a_stop_request_ends_its_request_within_a_step_and_frees_its_row(generator):
    service = _service(generator)
    try:
        other = Recorder([_item((9, 8), 30)])
        stopped = Recorder([_item()], ids=("trtspec-1", "client-id"))
        stopped.on_first = lambda: service.stop("client-id")
        service.submit(stopped.job)
        service.submit(other.job)
        assert stopped.ended.wait(TIMEOUT) and other.ended.wait(TIMEOUT)
        assert stopped.results[0].finish_reason == "cancelled"
        assert stopped.progress[0] <= 2  # the step running when the stop came may still report
        assert len(stopped.results[0].output_ids) < 100
        alone = generate(generator.engine, [9, 8], generator.proposer(), GenerationConfig(max_tokens=30))
        assert other.results[0].output_ids == alone.output_ids
        assert service.stats.cancelled == 1
        assert generator.engine.kv_rows[0] == 0 and service.in_flight == 0
        assert service.stop("client-id") == 0  # it is gone: a late stop is a no-op, as upstream's
    finally:
        service.shutdown()


def test_a_cancellation_seen_by_the_watcher_ends_the_request(generator):
    cancelled = threading.Event()
    service = _service(generator, cancel_poll_s=0.005)
    try:
        job = Recorder([_item(max_tokens=120), _item((3, 4), 120)], is_cancelled=cancelled.is_set)
        # the scheduler waits in the first prefill until the watcher has seen the cancellation: without the wait, a
        # scheduler that outran the watcher's poll (a loaded machine) finished the request before it was seen
        job.on_first = lambda: (cancelled.set(), _wait_until(lambda: job.job.stopped))
        service.submit(job.job)
        assert job.ended.wait(TIMEOUT)
        assert {r.finish_reason for r in job.results.values()} == {"cancelled"}
        assert all(len(r.output_ids) < 120 for r in job.results.values())
        assert generator.engine.kv_rows[0] == 0
    finally:
        service.shutdown()


def test_a_cancelled_request_still_queued_never_starts(generator):
    service = _service(generator, max_batch_size=1, cancel_poll_s=0.005)
    try:
        running = Recorder([_item(max_tokens=60)])
        queued = Recorder([_item((1, 2, 3), 60)], is_cancelled=lambda: True)
        # the running request holds the only row until the watcher has stopped the queued one (else, on a loaded
        # machine, the row could free before the watcher's first poll and the queued request start)
        running.on_second = lambda: _wait_until(lambda: queued.job.stopped)
        service.submit(running.job)
        service.submit(queued.job)
        assert queued.ended.wait(TIMEOUT)
        assert queued.results[0].finish_reason == "cancelled" and queued.results[0].output_ids == []
        assert 0 not in queued.progress  # no prefill, no token
        assert not running.ended.is_set() or running.results[0].finish_reason != "cancelled"
        assert running.ended.wait(TIMEOUT) and running.results[0].finish_reason != "cancelled"
        assert service.stats.cancelled == 1
    finally:
        service.shutdown()


def test_a_request_whose_state_cannot_be_read_is_ended(generator):
    def gone():
        raise RuntimeError("the request was released")

    service = _service(generator, cancel_poll_s=0.005)
    try:
        job = Recorder([_item(max_tokens=120)], is_cancelled=gone)
        service.submit(job.job)
        assert job.ended.wait(TIMEOUT) and job.results[0].finish_reason == "cancelled"
    finally:
        service.shutdown()


def test_queued_and_in_flight_counts(generator):
    service = _service(generator, max_batch_size=1)
    try:
        release = threading.Event()
        first = Recorder([_item(max_tokens=40)])
        first.on_second = lambda: release.wait(TIMEOUT)  # hold the scheduler inside the first verify step
        second = Recorder([_item((2, 3), 10)])
        service.submit(first.job)
        service.submit(second.job)
        # held there, the counts stay (1, 1): wait for them as long as a hang takes
        assert _wait_until(lambda: (service.in_flight, service.queued) == (1, 1))
        release.set()
        assert first.ended.wait(TIMEOUT) and second.ended.wait(TIMEOUT)
        assert (service.in_flight, service.queued) == (0, 0)
        assert service.last_step[0] == 1 and service.last_step[1] >= 1
    finally:
        service.shutdown()


def test_jobs_queued_together_share_every_step(generator):
    """In-flight batching across jobs, with arrival controlled: the scheduler is held in the first job's prefill until
    three more jobs are queued, so from the next step on all four run in one verify step (their 30 tokens cannot be
    done in one step, K + 1 = 9 a step at most). Every step's sequences add up to the steps each job took part in,
    and every output equals its prompt's alone."""
    service = _service(generator, max_batch_size=4)
    try:
        queued = threading.Event()
        prompts = [(5, 6, 7), (9, 8), (3, 4, 5, 6), (2, 7)]
        jobs = [Recorder([_item(p, 30)]) for p in prompts]
        jobs[0].on_first = lambda: queued.wait(TIMEOUT)  # hold the scheduler until every job is queued
        for job in jobs:
            service.submit(job.job)
        queued.set()
        assert all(job.ended.wait(TIMEOUT) for job in jobs)
        results = [job.results[0] for job in jobs]
        for prompt, result in zip(prompts, results):
            alone = generate(generator.engine, list(prompt), generator.proposer(), GenerationConfig(max_tokens=30))
            assert result.output_ids == alone.output_ids and result.finish_reason == "length"
        stats = service.stats
        assert stats.max_sequences == 4
        assert stats.sequences == sum(r.stats.steps for r in results)
        assert stats.steps < stats.sequences  # steps were shared
    finally:
        service.shutdown()


def test_a_drain_ends_what_is_left_with_an_error_and_reports_idle(generator, tmp_path):
    drain = DrainSignal(tmp_path / "drain")
    service = _service(generator, cancel_poll_s=0.005, drain=drain)
    try:
        job = Recorder([_item(max_tokens=120)])
        # the scheduler waits in the prefill until the watcher has ended the job (else a fast scheduler could finish
        # the request before the watcher looked at the drain file)
        job.on_first = lambda: (drain.start(), drain.end(), _wait_until(lambda: job.job.stopped))
        service.submit(job.job)
        assert job.ended.wait(TIMEOUT)
        assert job.errors == {0: DRAIN_MESSAGE} and not job.results
        assert _wait_until(drain.idle) and generator.engine.kv_rows[0] == 0
    finally:
        service.shutdown()


def test_no_idle_report_before_a_drain_is_asked_for(generator, tmp_path):
    drain = DrainSignal(tmp_path / "drain")
    looks = []
    requested = drain.requested
    drain.requested = lambda: looks.append(1) or requested()  # counts the watcher's looks at the drain file
    service = _service(generator, cancel_poll_s=0.005, drain=drain)
    try:
        # a fixed sleep proved nothing on a loaded machine (the watcher might not have looked yet): wait for a
        # whole round of the idle watcher's loop (it looks at the file once per round) instead
        assert _wait_until(lambda: len(looks) >= 2)
        assert not drain.idle()
    finally:
        service.shutdown()


@pytest.mark.parametrize("inputs, expected", [
    ({"stop": np.array([[True]])}, True), ({"stop": np.array([[False]])}, False), ({}, False),
    ({"stop": np.array([True])}, True)])
def test_stop_requests_are_recognised(inputs, expected):
    assert is_stop_request(inputs) is expected


def test_lookahead_sizes_follow_the_request_or_the_deployments_method(tiny_engine):
    """lookahead_* sizes need draft_method lookahead, sent or the deployment's; missing sizes come from the default
    that fits K (the tiny engine: K = 8 → 2,3,2)."""
    from trtspec.engine.manifest import read_manifest
    from trtspec.errors import ConfigError
    from trtspec.speculative.lookahead_proposer import LookaheadConfig
    from trtspec.triton.serving import parse_request

    manifest = read_manifest(tiny_engine)
    inputs = {"input_ids": np.array([[5, 6, 7]], np.int32), "input_lengths": np.array([[3]], np.int32),
              "request_output_len": np.array([[4]], np.int32), "lookahead_verification_set_size": np.array([[1]], np.int32)}
    with pytest.raises(ConfigError, match='send draft_method "lookahead" too'):
        parse_request(inputs, manifest)
    (item,) = parse_request(inputs, manifest, default_method="lookahead")
    assert item.config.lookahead == LookaheadConfig(2, 3, 1) and item.config.method is None
    (item,) = parse_request({**inputs, "draft_method": np.array([[b"lookahead"]], np.object_)}, manifest)
    assert item.config.method == "lookahead" and item.config.lookahead == LookaheadConfig(2, 3, 1)
