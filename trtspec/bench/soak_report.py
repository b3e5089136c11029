"""The report of a `trtspec bench soak` run (trtspec.bench.soak): its requests, figures and targets, the table it
prints and the files it writes (report.json, requests.csv, soak.png)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path

from trtspec.bench.summary import PERCENTILES, distribution, save_figure, subplots, write_csv

# the targets `--check` holds a run to (docs/serving-faults.md)
TARGET_MEMORY_GROWTH_PCT = 2.0
TARGET_TTFT_RATIO = 2.0
TARGET_SHUTDOWN_S = 5.0


@dataclass
class SoakRequest:
    """One request of the soak, a row of requests.csv; times in seconds since the run started. Its own record, not
    bench.summary's: a place on the run's timeline and an outcome against a reference, no drafter statistics."""

    seq: int
    user: int
    phase: str  # soak, probe, shutdown
    prompt_index: int
    start_s: float
    end_s: float = 0.0
    ttft_s: float | None = None
    latency_s: float | None = None
    tokens: int = 0
    finish_reason: str = ""
    outcome: str = ""  # ok, mismatch, truncated (a strict prefix of the reference), error
    first_diff: int | None = None  # the first token index that differs from the reference
    error: str = ""


@dataclass
class SoakReport:
    """Everything one soak run found; `to_dict` is report.json (the records go to requests.csv)."""

    options: dict
    machine: dict
    server: dict
    timeline: dict
    requests: int = 0
    errors: int = 0
    mismatches: int = 0
    error_messages: list[str] = field(default_factory=list)
    mismatch_details: list[dict] = field(default_factory=list)
    latency_s: dict = field(default_factory=dict)
    ttft_s: dict = field(default_factory=dict)
    tokens: int = 0
    tokens_per_s: float = 0.0
    memory: dict | None = None
    metrics: dict = field(default_factory=dict)
    after_load: dict = field(default_factory=dict)
    faults: dict | None = None
    shutdown: dict | None = None
    targets: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    records: list[SoakRequest] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(t["ok"] for t in self.targets)

    def to_dict(self, *, samples: bool = True) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("records", "samples")}
        d = json.loads(json.dumps(d, default=str))
        d["passed"] = self.passed
        if samples:
            d["samples"] = self.samples
        return d


def summarize(values: Iterable[float]) -> dict:
    """Count, bench.summary's distribution and max of some seconds (None each when empty)."""
    xs = list(values)
    figures = distribution(xs) or {"mean": None, **{f"p{p}": None for p in PERCENTILES}}
    return {"count": len(xs), **figures, "max": round(max(xs), 3) if xs else None}


def memory_summary(samples: list[dict], *, before: float, warm: float, end: float) -> dict | None:
    """start (the first sample at or after `warm`), peak and end (the last sample up to `end`) of the RSS samples,
    the growth in percent, and the growth over the load's second half (a leak keeps growing; a warming cache
    does not)."""
    rss = [s for s in samples if s.get("rss_mib") is not None]
    if not rss:
        return None
    pre = [s for s in rss if s["t"] <= before]
    load = [s for s in rss if before <= s["t"] <= end] or rss
    warm_samples = [s for s in load if s["t"] >= warm] or load[-1:]
    start_s, end_s = warm_samples[0], load[-1]
    mid = next((s for s in load if s["t"] >= (start_s["t"] + end_s["t"]) / 2), end_s)
    peak = max(load, key=lambda s: s["rss_mib"])
    growth = lambda a, b: round((b["rss_mib"] / a["rss_mib"] - 1) * 100, 3) if a["rss_mib"] else None  # noqa: E731
    return {"before_load_mib": pre[-1]["rss_mib"] if pre else None,
            "start_mib": start_s["rss_mib"], "start_t": start_s["t"],
            "peak_mib": peak["rss_mib"], "peak_t": peak["t"],
            "end_mib": end_s["rss_mib"], "end_t": end_s["t"],
            "growth_pct": growth(start_s, end_s), "second_half_growth_pct": growth(mid, end_s),
            "processes_end_mib": end_s.get("processes", {}), "processes_start_mib": start_s.get("processes", {})}


def targets(report: SoakReport) -> list[dict]:
    """The targets, each with its value and whether it is met (only those this run measured)."""
    out: list[dict] = []

    def target(name: str, goal: str, value, ok: bool) -> None:
        out.append({"name": name, "target": goal, "value": value, "ok": ok})

    target("errors", "0", report.errors, report.errors == 0)
    target("mismatches", "0", report.mismatches, report.mismatches == 0)
    if report.memory is not None and (g := report.memory.get("growth_pct")) is not None:
        target("memory growth %", f"< {TARGET_MEMORY_GROWTH_PCT:g}", g, g < TARGET_MEMORY_GROWTH_PCT)
    if report.after_load.get("checked"):
        target("nothing in flight after the load", "0", report.after_load.get("trtspec_engine_sequences_in_flight"),
               bool(report.after_load.get("in_flight_zero")))
    if report.faults is not None:
        ratio = report.faults.get("ttft_ratio")
        target("TTFT after faults ÷ unloaded", f"<= {TARGET_TTFT_RATIO:g}", ratio,
               ratio is not None and ratio <= TARGET_TTFT_RATIO)
        if "cancelled_delta" in report.after_load:
            want, got = report.after_load["cancelled_expected"], report.after_load["cancelled_delta"]
            target("faulted streams counted cancelled", f">= {want}", got, got >= want)
    if (s := report.shutdown) is not None:
        how = " (SIGTERM mid-load)" if s["mid_load"] else " (idle)"
        target(f"shutdown exit 0 within {TARGET_SHUTDOWN_S:g} s{how}", f"0, <= {TARGET_SHUTDOWN_S:g} s",
               f"{s['serve_exit']}, {s['seconds']:.2f} s",
               s["serve_exit"] == 0 and s["seconds"] <= TARGET_SHUTDOWN_S)
        target("serve's exit status = tritonserver's", "equal", f"{s['serve_exit']} / {s['tritonserver_exit']}",
               s["serve_exit"] == s["tritonserver_exit"])
        target("no server process left", "none", s["leftover_pids"], not s["leftover_pids"])
    return out


# ---- the table and the files ---------------------------------------------------------------------------------

def format_minutes(minutes: float) -> str:
    return f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:g} min"


def format_seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def status_line(elapsed: float, counts: dict, sample: dict) -> str:
    """The progress line the soak prints every few seconds of its load."""
    parts = [f"{elapsed:5.0f} s: {counts['requests']} requests, {counts['errors']} errors, "
             f"{counts['mismatches']} mismatches"]
    if sample.get("rss_mib") is not None:
        parts.append(f"RSS {sample['rss_mib']:.0f} MiB")
    m = sample.get("metrics") or {}
    if "trtspec_engine_sequences_in_flight" in m:
        parts.append(f"in flight {m['trtspec_engine_sequences_in_flight']:.0f}, "
                     f"queued {m.get('trtspec_engine_queue_size', 0):.0f}")
    return ", ".join(parts)


def format_report(report: SoakReport) -> list[str]:
    """The compact table `bench soak` prints."""
    o, lines = report.options, []
    where = o.get("repo") or o.get("url")
    bound = format_minutes(o["minutes"]) + (f" (or {o['max_requests']} requests)" if o.get("max_requests") else "")
    lines.append(f"soak of {where} ({report.server.get('url')}): {o['users']} users x {bound}, "
                 f"{o['prompts_loaded']} prompts of {o['prompt_set']}, max_tokens {o['max_tokens']}")
    lines.append(f"  machine        {report.machine['cores']} cores, load average at start "
                 f"{' / '.join(map(str, report.machine['loadavg_start']))}, at end "
                 f"{' / '.join(map(str, report.machine.get('loadavg_end', [])))}")
    lines.append(f"  requests       {report.requests} completed in {report.timeline.get('load_s', 0):.1f} s, "
                 f"{report.errors} errors, {report.mismatches} mismatches (outputs vs each prompt served alone)")
    for name, d in (("latency", report.latency_s), ("first token", report.ttft_s)):
        lines.append(f"  {name:<14} p50 {format_seconds(d.get('p50'))}, p90 {format_seconds(d.get('p90'))}, "
                     f"p99 {format_seconds(d.get('p99'))}, max {format_seconds(d.get('max'))}"
                     + (f" (unloaded {format_seconds(d.get('unloaded'))})" if name == "first token" else ""))
    lines.append(f"  tokens/s       {report.tokens_per_s:.1f} ({report.tokens:,} tokens)")
    if (m := report.memory) is not None:
        procs = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m["processes_end_mib"].items(), key=lambda kv: -kv[1]))
        lines.append(f"  memory (RSS)   start {m['start_mib']:.1f} MiB, peak {m['peak_mib']:.1f}, end "
                     f"{m['end_mib']:.1f}: growth {m['growth_pct']:+.2f}% "
                     f"(second half {m['second_half_growth_pct']:+.2f}%); before the load {m['before_load_mib']} MiB")
        lines.append(f"  processes      {procs} (MiB at the end of the load)")
    else:
        lines.append("  memory         not sampled")
    if (a := report.after_load).get("checked"):
        lines.append(f"  after the load in flight {_num(a.get('trtspec_engine_sequences_in_flight'))}, queued "
                     f"{_num(a.get('trtspec_engine_queue_size'))}, KV rows used {_num(a.get('trtspec_kv_rows_used'))}"
                     f" / free {_num(a.get('trtspec_kv_rows_free'))} (waited {a['waited_s']:.1f} s)")
    if (f := report.faults) is not None:
        ab, ca = f["abandon"], f["cancel"]
        lines.append(f"  faults         {ab['cut_mid_stream']}/{ab['requested']} abandoned and {ca['cut_mid_stream']}/"
                     f"{ca['requested']} cancelled mid-stream; cancelled counter +{_num(f['cancelled_counter_delta'])}; "
                     f"first token after them {format_seconds(f['fresh_ttft_median_s'])} = {f['ttft_ratio']}x "
                     "unloaded")
    if (s := report.shutdown) is not None:
        how = (f"SIGTERM mid-load ({s['requests_open_at_sigterm']} requests open, {s['streaming_at_sigterm']} "
               "streaming)") if s["mid_load"] else "SIGTERM idle"
        lines.append(f"  shutdown       {how}: serve exited {s['serve_exit']} in {s['seconds']:.2f} s, tritonserver "
                     f"{s['tritonserver_exit']}; streams completed {s['completed']}, ended early {s['ended_early']}, "
                     f"errors {s['errors']}")
        steps = [(label, s.get(key)) for label, key in (
            ("last stream ended", "last_request_end_after_s"), ("drain time over", "drain_over_after_s"),
            ("first model unloaded", "first_unload_after_s"), ("no model left", "no_live_models_after_s"))]
        if any(v is not None for _, v in steps):
            lines.append("  after SIGTERM  " + ", ".join(f"{label} {v:.2f} s" for label, v in steps if v is not None))
    if report.error_messages:
        lines.append(f"  first errors   {' | '.join(report.error_messages[:3])}")
    lines += [f"  note           {note}" for note in report.notes]
    lines.append("  targets        " + ", ".join(f"{t['name']} {t['value']} {'ok' if t['ok'] else 'MISSED'}"
                                                 for t in report.targets))
    return lines


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


CSV_FIELDS = [f.name for f in fields(SoakRequest)]


def write_outputs(report: SoakReport, out: Path) -> dict[str, Path]:
    """report.json, requests.csv and soak.png (when matplotlib is installed) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.json", "requests": out / "requests.csv"}
    written["report"].write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    with written["requests"].open("w", newline="") as f:
        write_csv(f, report.records, CSV_FIELDS)
    try:
        plot(report, out / "soak.png")
        written["plot"] = out / "soak.png"
    except ImportError:
        report.notes.append("soak.png not written: matplotlib is not installed")
    return written


def plot(report: SoakReport, png: Path) -> None:
    """Latency and time to first token per request (top), resident memory and requests in flight (bottom), over
    the run; the load, the faults and the SIGTERM marked."""
    fig, (top, bottom) = subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for phase, colour in (("soak", "tab:blue"), ("shutdown", "tab:red"), ("probe", "tab:green")):
        if rows := [r for r in report.records if r.phase == phase and r.latency_s is not None]:
            top.plot([r.end_s for r in rows], [r.latency_s for r in rows], ".", ms=3, color=colour,
                     label=f"latency ({phase})")
            top.plot([r.start_s + r.ttft_s for r in rows if r.ttft_s is not None],
                     [r.ttft_s for r in rows if r.ttft_s is not None], "x", ms=3, color=colour, alpha=0.5,
                     label=f"first token ({phase})")
    errors = [r for r in report.records if r.outcome == "error"]
    if errors:
        top.plot([r.end_s for r in errors], [0] * len(errors), "v", color="black", label="error")
    top.set(ylabel="seconds", title=f"soak: {report.options['users']} users, {report.requests} requests, "
                                    f"{report.errors} errors, {report.mismatches} mismatches")
    top.legend(fontsize=7, loc="upper left", ncol=3)
    samples = [s for s in report.samples if s.get("rss_mib") is not None]
    if samples:
        bottom.plot([s["t"] for s in samples], [s["rss_mib"] for s in samples], "-", color="tab:purple",
                    label="RSS, tritonserver + stubs")
        stub = [(s["t"], s["processes"].get("stub:tensorrt_llm")) for s in samples
                if s.get("processes", {}).get("stub:tensorrt_llm") is not None]
        if stub:
            bottom.plot(*zip(*stub), "--", color="tab:purple", alpha=0.6, label="RSS, engine stub (tensorrt_llm)")
    bottom.set(xlabel="seconds since the run started", ylabel="MiB")
    gauge = [(s["t"], s["metrics"]["trtspec_engine_sequences_in_flight"]) for s in report.samples
             if "trtspec_engine_sequences_in_flight" in s.get("metrics", {})]
    if gauge:
        twin = bottom.twinx()
        twin.step(*zip(*gauge), where="post", color="tab:orange", alpha=0.7, label="sequences in flight")
        twin.set_ylabel("in flight")
        twin.legend(fontsize=7, loc="lower right")
    bottom.legend(fontsize=7, loc="lower left")
    marks = [(report.timeline.get("load_start_t"), "load"), (report.timeline.get("load_end_t"), "load ends")]
    if report.faults is not None:
        marks.append((report.faults.get("cut_t"), "faults cut"))
    if report.shutdown is not None:
        marks.append((report.shutdown.get("sigterm_t"), "SIGTERM"))
    for t, label in marks:
        if t is not None:
            for ax in (top, bottom):
                ax.axvline(t, color="grey", ls=":", lw=1)
            top.annotate(label, (t, 1), xycoords=("data", "axes fraction"), fontsize=7, rotation=90, va="top",
                         ha="right", color="grey")
    save_figure(fig, png, dpi=110)
