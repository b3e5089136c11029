"""The pure parts of `trtspec bench soak`: its distribution summary, output comparison, metrics parsing
(trtspec.bench.metrics), RSS sampling and the port's owner from /proc (trtspec.procfs), the report, its targets,
table, files and plot, and the command's flag checks (no server: the served run is tests/triton/test_soak.py)."""

from __future__ import annotations

import csv
import json
import mmap
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.bench import soak
from trtspec.bench.metrics import flatten_metrics, parse_metrics
from trtspec.bench.soak import Sampler, SoakOptions, compare, is_loopback, process_label, split_url
from trtspec.bench.soak_report import (SoakReport, SoakRequest, format_report, memory_summary, status_line, summarize,
                                       targets, write_outputs)
from trtspec.cli import cli
from trtspec.errors import ConfigError, ServerError
from trtspec.procfs import listening_pids, port_owner, process_tree, rss_kib
from trtspec.triton.server import port_holder


def test_summarize_is_bench_summary_distribution_with_count_and_max():
    values = list(np.random.default_rng(0).exponential(2.0, 101)) + [0.0, 7.5]
    s = summarize(iter(values))
    for p in (50, 90, 99):
        assert s[f"p{p}"] == pytest.approx(float(np.percentile(values, p)), abs=1e-3)
    assert (s["count"], s["max"]) == (103, round(max(values), 3))
    s = summarize([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (s["count"], s["p50"], s["max"], s["mean"]) == (5, 3.0, 5.0, 3.0)
    assert summarize([1, 2, 3, 4])["p50"] == 2.5
    assert summarize([]) == {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}


def test_compare_tells_truncation_from_mismatch():
    assert compare([1, 2, 3], [1, 2, 3]) == ("ok", None)
    assert compare([1, 2], [1, 2, 3]) == ("truncated", 2)
    assert compare([], [1]) == ("truncated", 0)
    assert compare([1, 9, 3], [1, 2, 3]) == ("mismatch", 1)
    assert compare([1, 2, 3, 4], [1, 2, 3]) == ("mismatch", 3)  # tokens beyond the reference: another stream's


METRICS = """# HELP nv_inference_request_success Number of successful inference requests, all batch sizes
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="ensemble",version="1"} 120
nv_inference_request_success{model="tensorrt_llm",version="1"} 118
nv_inference_request_failure{model="ensemble",version="1",reason="BACKEND"} 2
nv_inference_request_failure{model="ensemble",version="1",reason="OTHER"} 1
# TYPE trtspec_engine_sequences_in_flight gauge
trtspec_engine_sequences_in_flight{model="tensorrt_llm",version="1"} 3
trtspec_kv_rows_free{model="tensorrt_llm"} 5
trtspec_engine_profile_steps_total{model="tensorrt_llm",slots="9"} 1.5e3
trtspec_engine_profile_steps_total{model="tensorrt_llm",slots="1"} 20
nv_cpu_memory_used_bytes 123456789
weird line without a value
label_with_escapes{path="a\\"b"} 1 1700000000000
"""


def test_parse_metrics_reads_prometheus_text():
    samples = parse_metrics(METRICS)
    assert ("nv_inference_request_success", {"model": "ensemble", "version": "1"}, 120.0) in samples
    assert ("label_with_escapes", {"path": 'a\\"b'}, 1.0) in samples  # a timestamp after the value is allowed
    assert not any(name == "weird" for name, _, _ in samples)
    flat = flatten_metrics(METRICS)
    assert flat['nv_inference_request_failure{model="ensemble"}'] == 3  # summed over the reason label
    assert flat["nv_inference_request_success"] == 238
    assert flat["trtspec_engine_profile_steps_total"] == 1520
    assert flat["trtspec_engine_sequences_in_flight"] == 3
    assert flat["trtspec_engine_profile_steps_total[9]"] == 1500 and flat["trtspec_engine_profile_steps_total[1]"] == 20
    assert "nv_cpu_memory_used_bytes" not in flat
    counters = flatten_metrics(METRICS, ("trtspec_",))  # what `bench serving`'s read_counters keeps
    assert set(counters) >= {"trtspec_kv_rows_free", "trtspec_engine_profile_steps_total[9]"}
    assert not any(k.startswith("nv_") for k in counters)


def test_rss_and_process_tree_of_this_process():
    before = rss_kib(os.getpid())
    assert before is not None and before > 10_000  # a Python with numpy and click loaded
    # fresh anonymous pages, touched: resident (a bytearray may reuse memory a long test session already holds)
    block = mmap.mmap(-1, 64 * 2**20)
    for offset in range(0, len(block), 4096):
        block[offset] = 1
    assert rss_kib(os.getpid()) - before > 50_000
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        tree = process_tree(os.getpid())
        assert tree[0] == os.getpid() and child.pid in tree
        sampler = Sampler(os.getpid(), None, interval=0.05).start()
        # the sampler's own thread takes samples after the first: wait for two of them (how many a fixed sleep
        # saw depended on the machine's load), as long as a hang takes
        deadline = time.monotonic() + 60
        while len(sampler.samples) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        sampler.stop()
        assert len(sampler.samples) >= 3
        assert sampler.samples[-1]["rss_mib"] > before / 1024 and child.pid in sampler.pids_seen
        assert len(sampler.samples[-1]["processes"]) >= 1
    finally:
        child.kill()
        child.wait()
    assert rss_kib(child.pid) is None and child.pid not in process_tree(os.getpid())
    assert process_tree(2**22 + 12345) == []
    del block


def test_process_labels():
    with open(f"/proc/{os.getpid()}/comm") as f:
        assert process_label(os.getpid()) == f.read().strip()
    # a Python backend stub is named for the model folder of the model.py it runs
    stub = subprocess.Popen(["triton_python_backend_stub", "-c", "import time; time.sleep(30)",
                             "/repo/tensorrt_llm/1/model.py"], executable=sys.executable)
    try:
        deadline = time.monotonic() + 30
        while process_label(stub.pid) != "stub:tensorrt_llm" and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has exec'd
        assert process_label(stub.pid) == "stub:tensorrt_llm"
    finally:
        stub.kill()
        stub.wait()


def test_the_owner_of_a_listening_port():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert listening_pids(port) == [] and port_owner(port) is None and port_holder(port) == ""
        server.listen()
        # a child inherits the listening socket: the owner is still this process, the one above it
        # (it says so once its interpreter runs: until its exec is done its descriptors cannot be read, and on a busy
        # machine that can be any time after Popen returns)
        child = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                                 pass_fds=[server.fileno()], stdout=subprocess.PIPE, text=True)
        try:
            assert child.stdout.readline() == "up\n"
            assert set(listening_pids(port)) == {os.getpid(), child.pid}
            assert port_owner(port) == os.getpid()
            with open(f"/proc/{os.getpid()}/comm") as f:
                assert port_holder(port) == f"pid {os.getpid()} ({f.read().strip()})"
        finally:
            child.kill()
            child.wait()
            child.stdout.close()


def test_memory_summary_start_peak_end_growth():
    samples = [{"t": float(t), "rss_mib": mib, "processes": {"tritonserver": mib}}
               for t, mib in enumerate([500, 600, 800, 805, 900, 810, 812, 816])]
    m = memory_summary(samples, before=0.5, warm=2.5, end=7)
    assert m["before_load_mib"] == 500 and m["start_mib"] == 805 and m["peak_mib"] == 900 and m["end_mib"] == 816
    assert m["growth_pct"] == pytest.approx((816 / 805 - 1) * 100, abs=1e-3)
    assert m["second_half_growth_pct"] == pytest.approx((816 / 810 - 1) * 100, abs=1e-3)
    assert memory_summary([{"t": 0.0}], before=0, warm=0, end=1) is None


def test_urls_and_loopback():
    assert split_url("127.0.0.1:8001") == ("127.0.0.1", 8001)
    assert split_url("[::1]:9") == ("::1", 9)
    assert split_url("localhost:1") == ("localhost", 1)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        split_url("http://x")
    assert is_loopback("127.0.0.5") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.1.2.3") and not is_loopback("example.com")


@pytest.mark.parametrize("options,message", [
    (SoakOptions(), "give either URL"),
    (SoakOptions(url="127.0.0.1:1", repo="r"), "give either URL"),
    (SoakOptions(url="10.0.0.2:8001"), "--allow-remote"),
    (SoakOptions(url="127.0.0.1:8001", sigterm=True), "--sigterm needs --repo"),
    (SoakOptions(url="127.0.0.1:8001", minutes=0), "--minutes must be > 0"),
    (SoakOptions(url="127.0.0.1:8001", users=0), "--users must be >= 1"),
    (SoakOptions(url="127.0.0.1:8001", cancel=-1), "--cancel must be >= 0"),
    (SoakOptions(repo="r", server_pid=1), "--server-pid is for URL mode"),
])
def test_options_are_checked_before_anything_runs(options, message):
    with pytest.raises(ConfigError, match=message):
        soak.run_soak(options, show=lambda line: None)


def test_a_soak_of_no_server_says_so_in_one_line():
    result = CliRunner().invoke(cli, ["bench", "soak", "127.0.0.1:1", "--minutes", "0.01", "--prompt-set",
                                      "missing.jsonl"])
    assert result.exit_code == 1 and "prompt file missing.jsonl does not exist" in result.output


def test_cli_help_and_flag_checks():
    runner = CliRunner()
    result = runner.invoke(cli, ["bench", "soak", "--help"])
    assert result.exit_code == 0
    for flag in ("--users", "--minutes", "--max-requests", "--max-tokens", "--prompt-set", "--abandon", "--cancel",
                 "--sigterm", "--out", "--json", "--repo", "--metrics-url", "--server-pid"):
        assert flag in result.output
    result = runner.invoke(cli, ["bench", "soak", "10.0.0.1:8001"])
    assert result.exit_code == 1 and "not a loopback address" in result.output
    result = runner.invoke(cli, ["bench", "soak", "127.0.0.1:8001", "--users", "0"])
    assert result.exit_code == 2 and "--users" in result.output


def _report(**changes) -> SoakReport:
    records = [SoakRequest(i, i % 2, "soak", i % 3, start_s=1.0 + i, end_s=3.0 + i, ttft_s=0.1 + i / 100,
                             latency_s=2.0, tokens=64, outcome="ok") for i in range(6)]
    records.append(SoakRequest(6, 0, "probe", 0, start_s=10, end_s=10.5, ttft_s=0.09, latency_s=0.5, tokens=16,
                                 outcome="ok"))
    records.append(SoakRequest(7, 1, "shutdown", 1, start_s=11, end_s=12, ttft_s=0.2, latency_s=1.0, tokens=9,
                                 outcome="truncated", first_diff=9))
    samples = [{"t": float(t), "rss_mib": 800.0 + t, "processes": {"tritonserver": 200.0, "stub:tensorrt_llm": 600 + t},
                "metrics": {"trtspec_engine_sequences_in_flight": float(t % 3)}} for t in range(14)]
    report = SoakReport(
        options={**{k: (str(v) if v is not None else None) if k in ("repo", "out") else v
                    for k, v in SoakOptions(repo="/tmp/r").__dict__.items()}, "prompts_loaded": 3},
        machine={"cores": 2, "loadavg_start": [0.5, 0.4, 0.3], "loadavg_end": [1.0, 0.8, 0.5]},
        server={"url": "127.0.0.1:1234"}, timeline={"load_start_t": 1.0, "load_end_t": 9.0, "load_s": 8.0},
        requests=6, latency_s=summarize([2.0] * 6), ttft_s={**summarize([0.1] * 6), "unloaded": 0.09},
        tokens=384, tokens_per_s=48.0, samples=samples, records=records,
        memory=memory_summary(samples, before=1, warm=2, end=9),
        after_load={"checked": True, "in_flight_zero": True, "waited_s": 0.3, "trtspec_engine_sequences_in_flight": 0,
                    "trtspec_engine_queue_size": 0, "trtspec_kv_rows_used": 0, "trtspec_kv_rows_free": 8,
                    "cancelled_delta": 4.0, "cancelled_expected": 4},
        faults={"abandon": {"requested": 2, "cut_mid_stream": 2}, "cancel": {"requested": 2, "cut_mid_stream": 2},
                "cut_t": 9.5, "cancelled_counter_delta": 4.0, "fresh_ttft_median_s": 0.1, "ttft_ratio": 1.11},
        shutdown={"mid_load": True, "requests_open_at_sigterm": 2, "streaming_at_sigterm": 2, "sigterm_t": 11.5,
                  "seconds": 2.4, "serve_exit": 0, "tritonserver_exit": 0, "leftover_pids": [], "completed": 1,
                  "ended_early": 1, "errors": 0})
    for key, value in changes.items():
        setattr(report, key, value)
    report.targets = targets(report)
    return report


def test_targets_pass_and_miss():
    report = _report()
    assert report.passed, report.targets
    names = [t["name"] for t in report.targets]
    assert names[:3] == ["errors", "mismatches", "memory growth %"]
    assert any("SIGTERM mid-load" in n for n in names) and "serve's exit status = tritonserver's" in names
    missed = _report(errors=2, shutdown={**report.shutdown, "seconds": 7.0, "tritonserver_exit": 1},
                     faults={**report.faults, "ttft_ratio": 2.5},
                     memory={**report.memory, "growth_pct": 3.1})
    bad = {t["name"] for t in missed.targets if not t["ok"]}
    assert bad == {"errors", "memory growth %", "TTFT after faults ÷ unloaded", "shutdown exit 0 within 5 s "
                   "(SIGTERM mid-load)", "serve's exit status = tritonserver's"}
    assert not missed.passed


def test_report_table_json_csv_and_plot(tmp_path):
    report = _report()
    lines = format_report(report)
    text = "\n".join(lines)
    for needle in ("6 completed", "0 errors, 0 mismatches", "p50 2.00 s", "first token", "(unloaded 90 ms)",
                   "tokens/s       48.0", "memory (RSS)   start 802.0 MiB, peak 809.0, end 809.0: growth +0.87%",
                   "stub:tensorrt_llm", "2/2 abandoned and 2/2 cancelled", "1.11x unloaded",
                   "serve exited 0 in 2.40 s, tritonserver 0", "load average at start 0.5 / 0.4 / 0.3", "targets"):
        assert needle in text, (needle, text)
    assert "MISSED" not in text
    written = write_outputs(report, tmp_path / "out")
    data = json.loads(written["report"].read_text())
    assert data["passed"] is True and data["requests"] == 6 and len(data["samples"]) == 14
    assert "records" not in data
    assert json.loads(json.dumps(report.to_dict(samples=False))).get("samples") is None
    rows = list(csv.DictReader(written["requests"].open()))
    assert len(rows) == 8 and rows[-1]["outcome"] == "truncated" and rows[0]["phase"] == "soak"
    png = written["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_status_line():
    line = status_line(30.2, {"requests": 10, "errors": 0, "mismatches": 0},
                       {"rss_mib": 812.4, "metrics": {"trtspec_engine_sequences_in_flight": 8.0,
                                                      "trtspec_engine_queue_size": 2.0}})
    assert line == "   30 s: 10 requests, 0 errors, 0 mismatches, RSS 812 MiB, in flight 8, queued 2"


class _FakeStreamClient:
    """A TritonClient stand-in for the --cancel streams: its stream gives a first token (unless `first` is False),
    then waits until cancelled and raises what a cancelled stream raises."""

    def __init__(self, *args, first: bool = True, **kwargs):
        self.first, self.cancelled, self.closed = first, threading.Event(), False

    def stream(self, prompt, options):
        if self.first:
            yield "a", None
        self.cancelled.wait(10)
        raise ServerError("Locally cancelled by application!")

    def cancel(self):
        self.cancelled.set()

    def close(self):
        self.closed = True


def test_cancel_streams_are_cut_at_their_first_token_and_counted(monkeypatch):
    """--cancel streams over TritonClient.stream: one with a first token is cut there by its own thread (leaving the
    stream), one without is cancelled by `cut()`; the cancellation's error is not counted as a failure."""
    clients = iter([_FakeStreamClient(), _FakeStreamClient(first=False)])
    monkeypatch.setattr(soak, "TritonClient", lambda *args, **kwargs: next(clients))
    faults = soak.FaultStreams("127.0.0.1:1", ["p"], abandon=0, cancel=2, max_tokens=8, model="m", epoch=0.0).start()
    assert not faults.wait_first_tokens(0.5)  # the second never has a first token
    faults.cut()
    for t in [t for t in threading.enumerate() if t.name.startswith("soak-cancel-")]:
        t.join(5)
    summary = faults.summary()["cancel"]
    assert (summary["cut_mid_stream"], summary["no_first_token"], summary["failed"]) == (1, 1, 0), faults.errors
    assert all(c.closed for c in faults._clients.values()) and faults._clients[1].cancelled.is_set()
    failing, events = _FakeStreamClient(first=False), []
    failing.cancel()  # a stream that fails before its first token: its error, one line
    soak._fault_stream(failing, "p", 4, lambda *event: events.append(event))
    assert events == [("error", "Locally cancelled by application!")] and failing.closed
