"""`trtspec bench soak --repo` end to end, short: a real `trtspec serve` of the long-answer tiny repository (steps of
~20 ms, as a real model's), 4 users for 8 requests (a count, not a time: how many requests a time allows depends on
the machine's load), 5 abandoned and 5 cancelled 1,000-token streams (more than the 8 batch rows: the queued ones get
a row as the first are cut), SIGTERM mid-load."""

from __future__ import annotations

import json

import pytest

from tests.triton.test_server import _prompts
from trtspec.bench.soak import SoakOptions, run_soak
from trtspec.bench.soak_report import format_report


@pytest.mark.slow
def test_short_soak_with_faults_and_sigterm(long_repo, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts(6, seed=11)))
    lines = []
    report = run_soak(SoakOptions(repo=long_repo, users=4, minutes=10, max_requests=8, max_tokens=24,
                                  prompt_set=str(prompts), prompts=6, abandon=5, cancel=5, fault_max_tokens=1000,
                                  sigterm=True, out=tmp_path / "out"), show=lines.append)
    table = "\n".join(format_report(report))
    print("\n".join(lines), table, sep="\n")  # shown with -s
    assert report.requests == 8, table  # every request started was answered
    assert report.errors == 0 and report.mismatches == 0, (report.error_messages, report.mismatch_details, table)
    assert report.latency_s["p99"] is not None and report.ttft_s["p50"] is not None
    assert report.memory is not None and report.memory["start_mib"] > 100  # tritonserver and its stubs sampled
    assert {"tritonserver", "stub:tensorrt_llm"} <= set(report.memory["processes_end_mib"])
    # the faulted streams: each cut mid-stream once it has its first token, all counted cancelled, nothing in flight
    assert report.faults["abandon"]["cut_mid_stream"] == 5 and report.faults["cancel"]["cut_mid_stream"] == 5, table
    assert report.after_load["in_flight_zero"], report.after_load
    assert report.after_load["cancelled_delta"] >= 10 and report.after_load["trtspec_kv_rows_used"] == 0
    assert report.faults["ttft_ratio"] is not None
    # SIGTERM mid-load: serve and tritonserver exit 0 by themselves (not killed at the end of the wait), nothing left
    # running; the seconds it took depend on the machine's load and are reported, not asserted
    s = report.shutdown
    assert s["mid_load"] and s["requests_open_at_sigterm"] >= 1, s
    assert s["serve_exit"] == 0 and s["tritonserver_exit"] == 0 and not s["leftover_pids"], s
    assert not s["killed_after_timeout"], s
    assert s["mismatches"] == 0, s
    for name in ("report.json", "requests.csv", "soak.png"):
        assert (tmp_path / "out" / name).stat().st_size > 0
    assert json.loads((tmp_path / "out" / "report.json").read_text())["samples"]
