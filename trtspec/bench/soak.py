"""A soak benchmark of a served deployment: N users streaming real prompts for M minutes, every greedy output
checked against the same prompt served alone, the server's resident memory and `/metrics` sampled every second,
faults injected on request, and a report (JSON, CSV of every request, PNG of latency and memory over time).
The order of a run, its two modes and how memory growth is counted: docs/serving.md.
"""

from __future__ import annotations

import csv
import ipaddress
import json
import math
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from trtspec.errors import ConfigError, ServerError

# targets (this machine, quickstart deployment; docs/serving-faults.md)
TARGET_MEMORY_GROWTH_PCT = 2.0
TARGET_TTFT_RATIO = 2.0
TARGET_SHUTDOWN_S = 5.0

PROBE_TOKENS = 16  # the time-to-first-token probe (unloaded, and again after the faults)
PROBES = 3
FAULT_FIRST_TOKEN_WAIT_S = 60.0  # how long a fault stream may take to its first token before it counts as failed
SETTLE_S = 10.0
WARMUP_SHARE = 0.1  # memory "start": not before this share of the load is over (caches and arenas grow first)  # after the faults: how long the gauges may take to show nothing in flight
SIGTERM_FIRST_TOKEN_WAIT_S = 60.0
STARTUP_TIMEOUT_S = 300.0

GAUGES = ("trtspec_engine_queue_size", "trtspec_engine_sequences_in_flight", "trtspec_kv_rows_used",
          "trtspec_kv_rows_free")
SAMPLED_COUNTERS = ("trtspec_requests_cancelled_total", "trtspec_engine_steps_total",
                    'nv_inference_request_success{model="ensemble"}', 'nv_inference_request_failure{model="ensemble"}',
                    "nv_inference_pending_request_count")


@dataclass(frozen=True, kw_only=True)
class SoakOptions:
    url: str | None = None  # HOST:PORT of a running server's gRPC endpoint
    repo: Path | None = None  # or: serve this repository here (`trtspec serve` on free loopback ports)
    users: int = 16
    minutes: float = 10.0
    max_requests: int | None = None
    max_tokens: int = 128
    prompt_set: str = "mt-bench"  # a known set or a .jsonl file (trtspec.data.prompts)
    prompts: int = 16  # distinct prompts, cycled over; each is served alone first for its reference output
    abandon: int = 0  # streams whose client process dies mid-stream (its connection dropped)
    cancel: int = 0  # streams the client cancels mid-stream (stop_stream(cancel_requests=True))
    fault_max_tokens: int = 512  # a faulted stream asks for this many tokens: it would still run if not stopped
    sigterm: bool = False  # --repo: SIGTERM `serve` mid-load
    drain_s: float = 1.0  # --repo: serve's --drain-seconds
    metrics_url: str | None = None
    server_pid: int | None = None
    allow_remote: bool = False
    model: str = "ensemble"
    out: Path | None = None
    sample_s: float = 1.0
    request_timeout_s: float = 300.0
    status_every_s: float = 10.0


@dataclass
class RequestRecord:
    """One request of the soak (one row of requests.csv); times in seconds since the run started."""

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
    records: list[RequestRecord] = field(default_factory=list)

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


# ---- pure helpers ---------------------------------------------------------------------------------------------

def percentile(values: Iterable[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation between closest ranks (numpy's default); None if empty."""
    xs = sorted(values)
    if not xs:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be in 0..100, got {q}")
    rank = (len(xs) - 1) * q / 100
    lo, hi = math.floor(rank), math.ceil(rank)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def summarize(values: Iterable[float]) -> dict:
    xs = list(values)
    if not xs:
        return {"count": 0, "p50": None, "p90": None, "p99": None, "mean": None, "max": None}
    r = lambda v: round(v, 4)  # noqa: E731
    return {"count": len(xs), "p50": r(percentile(xs, 50)), "p90": r(percentile(xs, 90)),
            "p99": r(percentile(xs, 99)), "mean": r(sum(xs) / len(xs)), "max": r(max(xs))}


def compare(output: list[int], reference: list[int]) -> tuple[str, int | None]:
    """ok; truncated (a strict prefix of the reference: the stream ended early); mismatch, with the first index
    that differs (tokens of another stream, or a different greedy choice)."""
    if output == reference:
        return "ok", None
    n = min(len(output), len(reference))
    diff = next((i for i in range(n) if output[i] != reference[i]), n)
    if diff == len(output):
        return "truncated", diff
    return "mismatch", diff


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition: (name, labels, value) per sample line; comments and bad lines are skipped."""
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        out.append((m[1], dict(_LABEL.findall(m[2] or "")), value))
    return out


def flatten_metrics(text: str, prefixes: tuple[str, ...] = ("trtspec_", "nv_inference_")) -> dict[str, float]:
    """Samples of the metrics named with `prefixes`, summed per name (`name`) and per name and model
    (`name{model="x"}`) over every other label."""
    flat: dict[str, float] = {}
    for name, labels, value in parse_metrics(text):
        if not name.startswith(prefixes):
            continue
        flat[name] = flat.get(name, 0.0) + value
        if "model" in labels:
            key = f'{name}{{model="{labels["model"]}"}}'
            flat[key] = flat.get(key, 0.0) + value
    return flat


def fetch_metrics(url: str, timeout: float = 3.0) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return flatten_metrics(response.read().decode("utf-8", errors="replace"))
    except (OSError, ValueError):
        return None


PAGE_KIB = os.sysconf("SC_PAGE_SIZE") // 1024 if hasattr(os, "sysconf") else 4


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process in KiB (/proc/PID/statm), None when it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE_KIB
    except (OSError, ValueError, IndexError):
        return None


def _stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, ppid) from /proc/PID/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    close = text.rfind(")")
    rest = text[close + 2:].split()
    return text[text.find("(") + 1:close], rest[0], int(rest[1])


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[1] not in ("Z", "X")


def process_tree(root: int) -> list[int]:
    """`root` and every live process below it (/proc), root first."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = _stat(int(name))
            if stat is not None and stat[1] not in ("Z", "X"):
                children.setdefault(stat[2], []).append(int(name))
    if not alive(root):
        return []
    tree, todo = [], [root]
    while todo:
        pid = todo.pop(0)
        tree.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return tree


def process_label(pid: int) -> str:
    """tritonserver; stub:MODEL for a Python backend stub (the model folder of its model.py); else its comm."""
    stat = _stat(pid)
    comm = stat[0] if stat else "?"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    if argv and "triton_python_backend_stub" in argv[0]:
        for arg in argv[1:]:
            if arg.endswith(".py"):
                parts = Path(arg).parts
                return f"stub:{parts[-3]}" if len(parts) >= 3 else "stub"
        return "stub"
    return comm


def listening_pids(port: int) -> list[int]:
    """Processes with a listening TCP socket on `port` (/proc/net/tcp{,6} and every process's fds we may read)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            try:
                if int(parts[1].rsplit(":", 1)[1], 16) == port and parts[3] == "0A":  # 0A: LISTEN
                    inodes.add(f"socket:[{parts[9]}]")
            except (IndexError, ValueError):
                continue
    if not inodes:
        return []
    pids = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if any(os.readlink(f"/proc/{name}/fd/{fd}") in inodes for fd in os.listdir(f"/proc/{name}/fd")):
                pids.append(int(name))
        except OSError:
            continue
    return pids


def server_process(port: int) -> int | None:
    """The process serving a port: of those listening on it, the one no other of them is an ancestor of."""
    pids = listening_pids(port)
    for pid in pids:
        ancestors, p = set(), pid
        while p > 1:
            stat = _stat(p)
            if stat is None:
                break
            p = stat[2]
            ancestors.add(p)
        if not ancestors & set(pids):
            return pid
    return pids[0] if pids else None


def split_url(url: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) → (host, port)."""
    m = re.fullmatch(r"\[?([^\[\]]+?)\]?:(\d+)", url.strip())
    if not m:
        raise ConfigError(f"URL {url!r}: expected HOST:PORT of a Triton gRPC endpoint, e.g. 127.0.0.1:8001")
    return m[1], int(m[2])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _first_line(error: BaseException) -> str:
    text = error.message() if hasattr(error, "message") and callable(error.message) else str(error)
    text = text.strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


# ---- sampling -------------------------------------------------------------------------------------------------

class Sampler:
    """Every `interval` seconds: RSS of the server process tree and the trtspec / nv_inference metrics."""

    def __init__(self, root_pid: int | None, metrics_url: str | None, *, interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, epoch: float | None = None):
        self.root_pid, self.metrics_url, self.interval = root_pid, metrics_url, interval
        self.clock, self.epoch = clock, clock() if epoch is None else epoch
        self.samples: list[dict] = []
        self.first_metrics: dict[str, float] | None = None
        self.last_metrics: dict[str, float] | None = None
        self.pids_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> dict:
        t = self.clock() - self.epoch
        entry: dict = {"t": round(t, 3)}
        if self.root_pid is not None:
            processes: dict[str, float] = {}
            total = 0
            for pid in process_tree(self.root_pid):
                kib = rss_kib(pid)
                if kib is None:
                    continue
                self.pids_seen.add(pid)
                total += kib
                label = process_label(pid)
                processes[label] = round(processes.get(label, 0.0) + kib / 1024, 2)
            entry["rss_mib"] = round(total / 1024, 2) if processes else None
            entry["processes"] = processes
        if self.metrics_url is not None:
            metrics = fetch_metrics(self.metrics_url)
            if metrics is not None:
                if self.first_metrics is None:
                    self.first_metrics = metrics
                self.last_metrics = metrics
                entry["metrics"] = {k: metrics[k] for k in GAUGES + SAMPLED_COUNTERS if k in metrics}
        with self._lock:
            self.samples.append(entry)
        return entry

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as e:  # noqa: BLE001: a sampler must not end the soak
                self.samples.append({"t": round(self.clock() - self.epoch, 3), "error": _first_line(e)})

    def start(self) -> Sampler:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.interval + 5)

    def latest(self) -> dict:
        with self._lock:
            return self.samples[-1] if self.samples else {}

    def window(self, start: float, end: float) -> list[dict]:
        with self._lock:
            return [s for s in self.samples if start <= s["t"] <= end and s.get("rss_mib") is not None]


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


# ---- the server under test ------------------------------------------------------------------------------------

class ServeProcess:
    """`trtspec serve REPO` as a user runs it, on free loopback ports; its stderr (banner and server log) kept."""

    def __init__(self, repo: Path, *, drain_s: float = 1.0, show: Callable[[str], None] = print):
        from trtspec.triton.server import free_port

        self.repo, self.drain_s, self.show = Path(repo), drain_s, show
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.process: subprocess.Popen | None = None
        self.lines: deque[str] = deque(maxlen=20000)
        self.times: deque[float] = deque(maxlen=20000)  # time.monotonic() when each line arrived
        self.status_lines: list[str] = []
        self.ready = threading.Event()
        self.tritonserver_pid: int | None = None
        self._reader: threading.Thread | None = None

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "trtspec.cli", "serve", str(self.repo), "--grpc-port", str(self.grpc_port),
                "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port),
                "--drain-seconds", str(self.drain_s)]

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> ServeProcess:
        self.process = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        self._reader = threading.Thread(target=self._read, name="soak-serve-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not self.ready.wait(0.25):
            if self.process.poll() is not None:
                self._reader.join(5)
                tail = " | ".join(line for line in list(self.lines)[-3:])
                raise ServerError(f"`trtspec serve {self.repo}` exited with status {self.process.returncode} while "
                                  f"starting: {tail}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"`trtspec serve {self.repo}` was not ready within {timeout_s:.0f} s")
        for _ in range(40):
            self.tritonserver_pid = server_process(self.grpc_port)
            if self.tritonserver_pid is not None:
                break
            time.sleep(0.25)
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            line = line.rstrip("\n")
            self.times.append(time.monotonic())
            self.lines.append(line)
            if line.startswith("serving "):
                self.ready.set()
            if line.startswith(("tritonserver exited", "Error: tritonserver exited", "error:")):
                self.status_lines.append(line)

    def tritonserver_status(self) -> int | None:
        """tritonserver's exit status as `serve` reported it on stderr (None when it said nothing)."""
        for line in reversed(self.status_lines):
            m = re.match(r"tritonserver exited \((\d+)\)", line) or \
                re.match(r"Error: tritonserver exited with status (\d+)", line)
            if m:
                return int(m[1])
        return None

    def sigterm(self, pids: Iterable[int] = ()) -> dict:
        """SIGTERM `serve`; wait for it (its drain time and then some), SIGKILL its session after that. Returns the
        seconds it took, its exit status, tritonserver's, and any process of the server left alive."""
        assert self.process is not None
        start = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        killed = False
        try:
            self.process.wait(self.drain_s + 60)
        except subprocess.TimeoutExpired:
            killed = True
            self.kill()
        took = time.monotonic() - start
        if self._reader is not None:
            self._reader.join(5)
        after = [(t - start, line) for t, line in zip(list(self.times), list(self.lines)) if t >= start]
        first = lambda text: next((round(t, 3) for t, line in after if text in line), None)  # noqa: E731
        code = self.process.returncode
        status = 128 - code if code < 0 else code
        time.sleep(0.2)
        leftover = sorted(p for p in set(pids) | {self.tritonserver_pid or 0} if p and alive(p))
        return {"seconds": round(took, 3), "serve_exit": status, "tritonserver_exit": self.tritonserver_status(),
                "killed_after_timeout": killed, "leftover_pids": leftover,
                # from serve's stderr: when its drain time ran out (None: everything finished within it), when
                # Triton began unloading and when it found no model left
                "drain_over_after_s": first("drain time over"),
                "first_unload_after_s": first("successfully unloaded"),
                "no_live_models_after_s": first("Found 0 live models"),
                "last_log_lines": [line for line in list(self.lines)[-8:]]}

    def write_log(self, path: Path, epoch: float) -> None:
        """serve's stderr, each line after the second of the soak it arrived at."""
        path.write_text("".join(f"[{t - epoch:9.3f}] {line}\n" for t, line in zip(list(self.times), list(self.lines))))

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                pass
            self.process.wait()
        if self.tritonserver_pid is not None and alive(self.tritonserver_pid):
            try:  # serve killed before it could stop its server: tritonserver has a session of its own
                os.killpg(self.tritonserver_pid, signal.SIGKILL)
            except OSError:
                pass


# ---- load -----------------------------------------------------------------------------------------------------

class Load:
    """`users` threads, each its own gRPC connection and stream, sending prompts round robin until stopped or
    `max_requests` were started; every completed output compared with its prompt's reference."""

    def __init__(self, url: str, prompts: list[str], references: list[list[int]], *, users: int, max_tokens: int,
                 phase: str, epoch: float, model: str = "ensemble", max_requests: int | None = None,
                 request_timeout_s: float = 300.0, first_seq: int = 0, stop_on_error: bool = False):
        self.url, self.prompts, self.references, self.users = url, prompts, references, users
        self.max_tokens, self.phase, self.epoch, self.model = max_tokens, phase, epoch, model
        self.max_requests, self.request_timeout_s, self.stop_on_error = max_requests, request_timeout_s, stop_on_error
        self.records: list[RequestRecord] = []
        self.stopping = threading.Event()
        self.exhausted = threading.Event()  # max_requests were started
        self.warm = threading.Event()  # every user finished a request
        self.warm_at: float | None = None
        self.first_token = [threading.Event() for _ in range(users)]
        self._next, self._first_seq = first_seq, first_seq
        self._lock = threading.Lock()
        self._done_users: set[int] = set()
        self._threads: list[threading.Thread] = []

    def now(self) -> float:
        return time.monotonic() - self.epoch

    def _take(self) -> int | None:
        with self._lock:
            if self.stopping.is_set():
                return None
            if self.max_requests is not None and self._next - self._first_seq >= self.max_requests:
                self.exhausted.set()
                return None
            seq = self._next
            self._next += 1
            if self.max_requests is not None and self._next - self._first_seq >= self.max_requests:
                self.exhausted.set()
            return seq

    def _user(self, user: int) -> None:
        from trtspec.speculative.loop import GenerationConfig
        from trtspec.triton.client import TritonClient

        client = None
        options = GenerationConfig(max_tokens=self.max_tokens)
        try:
            while True:
                seq = self._take()
                if seq is None:
                    return
                index = seq % len(self.prompts)
                record = RequestRecord(seq, user, self.phase, index, round(self.now(), 4))
                try:
                    if client is None:
                        client = TritonClient(self.url, model=self.model, timeout_s=self.request_timeout_s)
                    g = client.generate(self.prompts[index], options, index=index,
                                        on_text=lambda _piece, u=user: self.first_token[u].set())
                except Exception as e:  # noqa: BLE001: every failure is a counted error of this request
                    record.outcome, record.error = "error", _first_line(e)
                    _close_quietly(client)
                    client = None
                    self.stopping.wait(0.5)  # a server that is gone must not turn into thousands of errors a second
                else:
                    self.first_token[user].set()
                    record.ttft_s = round(g.ttft_s, 5) if g.output_ids else None
                    record.latency_s = round(g.total_s, 5)
                    record.tokens, record.finish_reason = len(g.output_ids), g.finish_reason
                    record.outcome, record.first_diff = compare(g.output_ids, self.references[index])
                record.end_s = round(self.now(), 4)
                with self._lock:
                    self.records.append(record)
                    if record.outcome != "error":
                        self._done_users.add(user)
                        if len(self._done_users) == self.users and self.warm_at is None:
                            self.warm_at = record.end_s
                            self.warm.set()
                if record.outcome == "error" and self.stop_on_error:
                    return
        finally:
            _close_quietly(client)

    def start(self) -> Load:
        self._threads = [threading.Thread(target=self._user, args=(u,), name=f"soak-user-{u}", daemon=True)
                         for u in range(self.users)]
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def join(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return not self.running()

    def counts(self) -> dict:
        with self._lock:
            records = list(self.records)
        return {"requests": sum(r.outcome != "error" for r in records),
                "errors": sum(r.outcome == "error" for r in records),
                "mismatches": sum(r.outcome in ("mismatch", "truncated") for r in records)}


def _close_quietly(client, timeout: float = 10.0) -> None:
    """Close a client without waiting on a broken stream for ever."""
    if client is None:
        return

    def close():
        try:
            client.close()
        except Exception:  # noqa: BLE001
            pass

    t = threading.Thread(target=close, daemon=True)
    t.start()
    t.join(timeout)


# ---- faults ---------------------------------------------------------------------------------------------------

ABANDON_CHILD = "import sys; from trtspec.bench.soak import abandoning_client; abandoning_client(sys.argv[1])"


def abandoning_client(spec_json: str) -> None:
    """The child process of --abandon: opens one client and stream per prompt, prints `first I` once stream I sent
    its first token (`error I ...` / `final I` otherwise), then waits to be killed with its streams open (its
    connections dropped by the kernel, as a client that crashes or loses its network). Gives up after 10 min."""
    import tritonclient.grpc as grpcclient

    from trtspec.speculative.loop import GenerationConfig
    from trtspec.triton.client import build_inputs

    spec = json.loads(spec_json)
    lock = threading.Lock()

    def say(text):
        with lock:
            print(text, flush=True)

    clients = []
    for i, prompt in enumerate(spec["prompts"], start=spec.get("first_index", 0)):
        seen = {"first": False}

        def callback(result=None, error=None, i=i, seen=seen):
            if error is not None:
                say(f"error {i} {_first_line(error)}")
                return
            response = result.get_response()
            if response.outputs and not seen["first"]:
                seen["first"] = True
                say(f"first {i}")
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                say(f"final {i}")

        client = grpcclient.InferenceServerClient(spec["url"])
        client.start_stream(callback=callback)
        inputs = build_inputs(prompt, GenerationConfig(max_tokens=spec["max_tokens"]), stream=True,
                              accepted=set(spec["accepted"]) if spec.get("accepted") is not None else None)
        client.async_stream_infer(spec["model"], inputs, request_id=f"soak-abandon-{i}",
                                  enable_empty_final_response=True)
        clients.append(client)
    time.sleep(600)
    os._exit(3)


class FaultStreams:
    """--abandon streams (one child process each, SIGKILLed) and --cancel streams (cancelled by this process), started
    together; each is cut as soon as it has sent its first token (its row then goes to a fault stream still queued:
    more streams than batch rows all get cut mid-stream), and `cut()` ends what is left (failed, or the wait over)."""

    def __init__(self, url: str, prompts: list[str], *, abandon: int, cancel: int, max_tokens: int, model: str,
                 epoch: float, accepted: set[str] | None = None):
        self.url, self.prompts, self.abandon, self.cancel = url, prompts, abandon, cancel
        self.accepted = accepted  # the model's input names (build_inputs adapts the request to them)
        self.max_tokens, self.model, self.epoch = max_tokens, model, epoch
        self.state: dict[str, dict[int, str]] = {"abandon": {}, "cancel": {}}  # first / final / error ...
        self.errors: list[str] = []
        self._changed = threading.Condition()
        self._children: dict[int, subprocess.Popen] = {}
        self._clients: dict[int, object] = {}
        self._cut: dict[str, set[int]] = {"abandon": set(), "cancel": set()}
        self._to_cancel: queue.Queue = queue.Queue()
        self.started_at = self.cut_at = None

    def _mark(self, kind: str, i: int, what: str) -> None:
        with self._changed:
            previous = self.state[kind].get(i)
            if what.startswith("error") and (self.cut_at is not None or i in self._cut[kind]):
                return  # what a cut stream answers ("Locally cancelled by application!")
            if what == "final" and i in self._cut[kind]:
                return  # cut mid-stream: whatever ends it now is the cut's doing
            if what.startswith("error"):
                self.errors.append(f"{kind} {i}: {what[6:]}")
                if previous is None:
                    self.state[kind][i] = "error"
            elif what == "final":
                self.state[kind][i] = "final" if previous in (None, "first") else previous
            elif previous is None:
                self.state[kind][i] = what
            self._changed.notify_all()

    def start(self) -> FaultStreams:
        import tritonclient.grpc as grpcclient

        from trtspec.speculative.loop import GenerationConfig
        from trtspec.triton.client import build_inputs

        self.started_at = time.monotonic() - self.epoch
        prompt = lambda i: self.prompts[i % len(self.prompts)]  # noqa: E731
        for i in range(self.abandon):
            spec = {"url": self.url, "model": self.model, "max_tokens": self.max_tokens, "prompts": [prompt(i)],
                    "first_index": i, "accepted": sorted(self.accepted) if self.accepted is not None else None}
            self._children[i] = subprocess.Popen([sys.executable, "-c", ABANDON_CHILD, json.dumps(spec)],
                                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                                 start_new_session=True)
            threading.Thread(target=self._read_child, args=(i,), name=f"soak-abandon-{i}", daemon=True).start()
        if self.cancel:
            threading.Thread(target=self._cancel_each, name="soak-cancel", daemon=True).start()
        for i in range(self.cancel):
            def callback(result=None, error=None, i=i):
                if error is not None:
                    self._mark("cancel", i, f"error {_first_line(error)}")
                    return
                response = result.get_response()
                if response.outputs:
                    self._mark("cancel", i, "first")
                    self._to_cancel.put(i)  # not from the stream's own callback thread
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    self._mark("cancel", i, "final")

            client = grpcclient.InferenceServerClient(self.url)
            client.start_stream(callback=callback)
            client.async_stream_infer(self.model, build_inputs(prompt(self.abandon + i),
                                                               GenerationConfig(max_tokens=self.max_tokens),
                                                               stream=True, accepted=self.accepted),
                                      request_id=f"soak-cancel-{i}", enable_empty_final_response=True)
            self._clients[i] = client
        return self

    def _cancel_each(self) -> None:
        """Cancel each --cancel stream once it has sent its first token."""
        while True:
            i = self._to_cancel.get()
            if i is None:
                return
            self._cancel(i)

    def _cancel(self, i: int) -> None:
        with self._changed:
            if i in self._cut["cancel"] or i not in self._clients:
                return
            self._cut["cancel"].add(i)
            client = self._clients[i]
        try:
            client.stop_stream(cancel_requests=True)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"cancel: {_first_line(e)}")
        _close_quietly(client)

    def _read_child(self, i: int) -> None:
        """Abandon stream i: its child process is SIGKILLed once the stream sent its first token."""
        child = self._children[i]
        assert child.stdout is not None
        for line in child.stdout:
            parts = line.strip().split(" ", 2)
            if len(parts) >= 2 and parts[1].isdigit():
                self._mark("abandon", i, parts[0] if parts[0] != "error" else f"error {parts[-1]}")
                if parts[0] == "first":
                    self._kill(i)
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            return
        if child.returncode != -signal.SIGKILL:  # the child died before it was killed
            self._mark("abandon", i, f"error the abandoning client exited with {child.returncode}")

    def _kill(self, i: int) -> None:
        with self._changed:
            self._cut["abandon"].add(i)
        child = self._children[i]
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)

    def wait_first_tokens(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._changed:
            while (len(self.state["abandon"]) < self.abandon or len(self.state["cancel"]) < self.cancel):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._changed.wait(left)
        return True

    def cut(self) -> None:
        """End every fault stream not cut yet (those without a first token: failed, or the wait was over)."""
        self.cut_at = time.monotonic() - self.epoch
        self.kill()
        for i in list(self._clients):
            self._cancel(i)
        self._to_cancel.put(None)

    def kill(self) -> None:
        for i, child in self._children.items():
            if child.poll() is None:
                self._kill(i)
            child.wait()

    def summary(self) -> dict:
        with self._changed:
            state = {k: dict(v) for k, v in self.state.items()}
        out = {}
        for kind, n in (("abandon", self.abandon), ("cancel", self.cancel)):
            values = [state[kind].get(i, "no first token") for i in range(n)]
            out[kind] = {"requested": n, "cut_mid_stream": values.count("first"),
                         "finished_before_cut": values.count("final"), "failed": values.count("error"),
                         "no_first_token": values.count("no first token")}
        out["started_t"] = round(self.started_at, 3) if self.started_at is not None else None
        out["cut_t"] = round(self.cut_at, 3) if self.cut_at is not None else None
        out["errors"] = self.errors[:10]
        return out


# ---- one run --------------------------------------------------------------------------------------------------

def _probe(url: str, model: str, prompt: str, reference: list[int], epoch: float, seq: int,
           timeout: float, tokens: int = PROBE_TOKENS) -> RequestRecord:
    """One short request alone: its time to first token, and its tokens against the reference's first ones."""
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.triton.client import TritonClient

    record = RequestRecord(seq, -1, "probe", 0, round(time.monotonic() - epoch, 4))
    try:
        with TritonClient(url, model=model, timeout_s=timeout) as client:
            g = client.generate(prompt, GenerationConfig(max_tokens=tokens))
    except Exception as e:  # noqa: BLE001
        record.outcome, record.error = "error", _first_line(e)
    else:
        record.ttft_s, record.latency_s = round(g.ttft_s, 5), round(g.total_s, 5)
        record.tokens, record.finish_reason = len(g.output_ids), g.finish_reason
        record.outcome, record.first_diff = compare(g.output_ids, reference[:tokens])
    record.end_s = round(time.monotonic() - epoch, 4)
    return record


def _validate(options: SoakOptions) -> None:
    if (options.url is None) == (options.repo is None):
        raise ConfigError("give either URL (a running server's gRPC HOST:PORT) or --repo REPO (served by the soak)")
    for name in ("users", "max_tokens", "prompts", "fault_max_tokens"):
        if getattr(options, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(options, name)}")
    for name in ("abandon", "cancel"):
        if getattr(options, name) < 0:
            raise ConfigError(f"--{name} must be >= 0, got {getattr(options, name)}")
    if not options.minutes > 0:
        raise ConfigError(f"--minutes must be > 0, got {options.minutes}")
    if options.max_requests is not None and options.max_requests < 1:
        raise ConfigError(f"--max-requests must be >= 1, got {options.max_requests}")
    if options.sigterm and options.repo is None:
        raise ConfigError("--sigterm needs --repo: the soak signals only a server it started itself")
    if options.url is not None:
        host, _ = split_url(options.url)
        if not options.allow_remote and not is_loopback(host):
            raise ConfigError(f"{options.url} is not a loopback address; the soak loads a server for minutes: pass "
                              "--allow-remote to aim it at another machine (memory is then not sampled)")
    if options.repo is not None and options.server_pid is not None:
        raise ConfigError("--server-pid is for URL mode; with --repo the soak knows its server")


def run_soak(options: SoakOptions, show: Callable[[str], None] = print) -> SoakReport:
    """One soak run (module docstring); writes report.json, requests.csv and soak.png to options.out if given."""
    from trtspec.data.prompts import load_prompts
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.triton.client import TritonClient

    _validate(options)
    epoch = time.monotonic()
    now = lambda: time.monotonic() - epoch  # noqa: E731
    prompts = [p.text for p in load_prompts(options.prompt_set, limit=options.prompts)]
    if not prompts:
        raise ConfigError(f"prompt set {options.prompt_set} has no prompts")
    report = SoakReport(options={k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
                        machine={"cores": os.cpu_count(), "loadavg_start": [round(x, 2) for x in os.getloadavg()]},
                        server={}, timeline={})
    report.options["prompts_loaded"] = len(prompts)
    show(f"soak: load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores")

    served: ServeProcess | None = None
    sampler: Sampler | None = None
    faults: FaultStreams | None = None
    before_faults: dict | None = None
    loads: list[Load] = []
    probes: list[RequestRecord] = []
    try:
        if options.repo is not None:
            show(f"starting `trtspec serve {options.repo}` on free loopback ports ...")
            served = ServeProcess(options.repo, drain_s=options.drain_s, show=show).start()
            url, metrics_url, pid = served.grpc_url, served.metrics_url, served.tritonserver_pid
            report.server.update(mode="repo", repo=str(options.repo), argv=served.argv()[1:])
            report.timeline["startup_s"] = round(now(), 3)
        else:
            url = options.url
            host, port = split_url(url)
            metrics_url = options.metrics_url or f"http://{'[' + host + ']' if ':' in host else host}:8002/metrics"
            pid = options.server_pid if options.server_pid is not None else (
                server_process(port) if is_loopback(host) else None)
            report.server.update(mode="url")
            if options.server_pid is not None and not alive(options.server_pid):
                raise ConfigError(f"--server-pid {options.server_pid}: no such process")
        report.server.update(url=url, metrics_url=metrics_url, pid=pid,
                             process=process_label(pid) if pid is not None else None)
        if pid is None:
            report.notes.append("memory not sampled: no local process listens on the gRPC port (pass --server-pid)")
        elif report.server["process"] != "tritonserver":
            report.notes.append(f"the process on the gRPC port is {report.server['process']!r}, not tritonserver")
        with TritonClient(url, model=options.model) as client:
            client.check_ready(wait_s=30)
            accepted = client.model_inputs()
        if fetch_metrics(metrics_url) is None:
            report.notes.append(f"no metrics at {metrics_url} (pass --metrics-url)")
            metrics_url = None
        sampler = Sampler(pid, metrics_url, interval=options.sample_s, epoch=epoch).start()

        # references: each distinct prompt alone, greedy
        show(f"references: {len(prompts)} prompts of {options.prompt_set}, each alone, max_tokens "
             f"{options.max_tokens} ...")
        references, reference_times = [], []
        started = now()
        with TritonClient(url, model=options.model, timeout_s=options.request_timeout_s) as client:
            for i, prompt in enumerate(prompts):
                try:
                    g = client.generate(prompt, GenerationConfig(max_tokens=options.max_tokens), index=i)
                except ServerError as e:
                    raise ServerError(f"reference for prompt {i} failed: {e}") from None
                references.append(g.output_ids)
                reference_times.append(g.total_s)
        report.timeline["references_s"] = round(now() - started, 3)
        report.timeline["reference_tokens"] = sum(map(len, references))

        # the unloaded time to first token
        probe_tokens = min(PROBE_TOKENS, options.max_tokens)
        probes += [_probe(url, options.model, prompts[0], references[0], epoch, -1 - i, options.request_timeout_s,
                          probe_tokens) for i in range(PROBES)]
        unloaded = [p.ttft_s for p in probes if p.ttft_s is not None]
        unloaded_ttft = percentile(unloaded, 50)

        # the load
        load_s = options.minutes * 60
        bound = _minutes(options.minutes) + (f" or {options.max_requests} requests" if options.max_requests else "")
        show(f"load: {options.users} users, {bound}; unloaded time to first token "
             f"{_fmt_s(unloaded_ttft)} (median of {len(unloaded)})")
        load = Load(url, prompts, references, users=options.users, max_tokens=options.max_tokens, phase="soak",
                    epoch=epoch, model=options.model, max_requests=options.max_requests,
                    request_timeout_s=options.request_timeout_s)
        loads.append(load)
        load_start = now()
        report.timeline["load_start_t"] = round(load_start, 3)
        load.start()
        next_status = load_start + options.status_every_s
        while now() < load_start + load_s and not load.exhausted.is_set() and load.running():
            time.sleep(min(0.25, max(0.0, load_start + load_s - now())))
            if now() >= next_status:
                next_status += options.status_every_s
                show("  " + _status_line(now() - load_start, load.counts(), sampler.latest()))
        load.stop()  # no new request from here: the faults run beside the load's last requests
        report.timeline["load_end_t"] = round(now(), 3)

        # faults: opened while the load's last requests still run, cut after their first token
        if options.abandon or options.cancel:
            show(f"faults: {options.abandon} abandoned and {options.cancel} cancelled streams of "
                 f"{options.fault_max_tokens} tokens, while the last requests finish ...")
            before_faults = fetch_metrics(metrics_url) if metrics_url else None
            faults = FaultStreams(url, prompts, abandon=options.abandon, cancel=options.cancel,
                                  max_tokens=options.fault_max_tokens, model=options.model, epoch=epoch,
                                  accepted=accepted).start()
            faults.wait_first_tokens(FAULT_FIRST_TOKEN_WAIT_S)
            faults.cut()
        if not load.join(options.request_timeout_s + 30):
            report.notes.append("some users were still waiting for their last response when the soak gave up")
        drained_t = max((r.end_s for r in load.records), default=now())
        report.timeline["last_request_end_t"] = round(drained_t, 3)

        # after the load (and the faults): a fresh request, and the engine's gauges back to nothing in flight
        fresh = [_probe(url, options.model, prompts[0], references[0], epoch, -10 - i, options.request_timeout_s,
                        probe_tokens) for i in range(PROBES)]
        probes += fresh
        settle = _settle(metrics_url, before_faults,
                         sum(faults.summary()[k]["cut_mid_stream"] for k in ("abandon", "cancel")) if faults else 0,
                         epoch)
        report.after_load = settle
        if faults is not None:
            fresh_ttfts = [p.ttft_s for p in fresh if p.ttft_s is not None]
            median = percentile(fresh_ttfts, 50)
            report.faults = {**faults.summary(), "cancelled_counter_delta": settle.get("cancelled_delta"),
                             "fresh_ttft_s": [p.ttft_s for p in fresh],
                             "fresh_ttft_median_s": median, "unloaded_ttft_s": unloaded_ttft,
                             "ttft_ratio": round(median / unloaded_ttft, 3) if median and unloaded_ttft else None}
        report.timeline["after_load_checks_end_t"] = round(now(), 3)
        warm = max(load.warm_at if load.warm_at is not None else load_start,
                   load_start + WARMUP_SHARE * (report.timeline["load_end_t"] - load_start))
        report.memory = memory_summary(sampler.samples, before=load_start, warm=warm,
                                       end=report.timeline["load_end_t"] if faults is not None else drained_t)
        if load.warm_at is None:
            report.notes.append("not every user finished a request: memory start is the first sample of the load")

        # the stop: SIGTERM under a fresh load (--sigterm) or idle
        if served is not None:
            if options.sigterm:
                show(f"shutdown: {options.users} users again, SIGTERM to serve once each has its first token ...")
                stop_load = Load(url, prompts, references, users=options.users, max_tokens=options.max_tokens,
                                 phase="shutdown", epoch=epoch, model=options.model, max_requests=options.users,
                                 request_timeout_s=options.request_timeout_s, first_seq=load._next,
                                 stop_on_error=True)
                loads.append(stop_load)
                stop_load.start()
                # every user streaming, or (more users than the engine has rows) the first one done
                deadline = time.monotonic() + SIGTERM_FIRST_TOKEN_WAIT_S
                while time.monotonic() < deadline and not all(e.is_set() for e in stop_load.first_token) \
                        and not stop_load.records:
                    time.sleep(0.05)
                stop_load.stop()  # no new request after the signal
                streaming = sum(e.is_set() for e in stop_load.first_token) - len(stop_load.records)
                streams = options.users - len(stop_load.records)
            else:
                stop_load, streams, streaming = None, 0, 0
            sigterm_t = now()
            shutdown = served.sigterm(set(sampler.pids_seen))
            ends = [r.end_s - sigterm_t for r in stop_load.records] if stop_load else []
            shutdown["last_request_end_after_s"] = round(max(ends), 3) if ends else None
            if options.out is not None:
                Path(options.out).mkdir(parents=True, exist_ok=True)
                served.write_log(Path(options.out) / "serve.log", epoch)
            if stop_load is not None:
                stop_load.join(30)
            sampler.stop()
            outcomes = [r.outcome for r in stop_load.records] if stop_load else []
            report.shutdown = {"mid_load": options.sigterm, "requests_open_at_sigterm": streams,
                               "streaming_at_sigterm": streaming,
                               "sigterm_t": round(sigterm_t, 3), **shutdown,
                               "completed": outcomes.count("ok"), "ended_early": outcomes.count("truncated"),
                               "errors": outcomes.count("error"), "mismatches": outcomes.count("mismatch"),
                               "error_messages": sorted({r.error for r in stop_load.records if r.error})[:5]
                               if stop_load else []}
            served = None
        else:
            sampler.stop()
    except BaseException:
        if served is not None and options.out is not None:
            Path(options.out).mkdir(parents=True, exist_ok=True)
            served.write_log(Path(options.out) / "serve.log", epoch)
        raise
    finally:
        if faults is not None:
            faults.kill()
        for load in loads:
            load.stop()
        if sampler is not None:
            sampler.stop()
        if served is not None:
            served.kill()

    _fill(report, loads, probes, sampler, unloaded_ttft, load_start, options)
    if options.out is not None:
        write_outputs(report, Path(options.out))
    return report


def _settle(metrics_url: str | None, before: dict | None, expected_cancelled: int, epoch: float) -> dict:
    """Poll the gauges until nothing is in flight or queued, no KV row is used and (after faults) the cancelled
    counter grew by the streams cut mid-stream; up to SETTLE_S."""
    if metrics_url is None:
        return {"checked": False}
    start = time.monotonic()
    metrics: dict = {}
    while True:
        metrics = fetch_metrics(metrics_url) or {}
        if "trtspec_engine_sequences_in_flight" not in metrics:
            return {"checked": False, "note": "the server publishes no trtspec_engine_sequences_in_flight gauge"}
        delta = metrics.get("trtspec_requests_cancelled_total", 0.0) - (before or {}).get(
            "trtspec_requests_cancelled_total", 0.0)
        idle = all(metrics.get(g, 0.0) == 0 for g in GAUGES[:3])
        if idle and (before is None or delta >= expected_cancelled):
            break
        if time.monotonic() - start > SETTLE_S:
            break
        time.sleep(0.25)
    out = {"checked": True, "in_flight_zero": idle, "waited_s": round(time.monotonic() - start, 3),
           "t": round(time.monotonic() - epoch, 3), **{g: metrics.get(g) for g in GAUGES}}
    if before is not None:
        out["cancelled_delta"] = delta
        out["cancelled_expected"] = expected_cancelled
    return out


def _fill(report: SoakReport, loads: list[Load], probes: list[RequestRecord], sampler: Sampler | None,
          unloaded_ttft: float | None, load_start: float, options: SoakOptions) -> None:
    records = sorted([r for load in loads for r in load.records] + probes, key=lambda r: (r.start_s, r.seq))
    report.records = records
    soak = [r for r in records if r.phase == "soak"]
    done = [r for r in soak if r.outcome != "error"]
    failed = [r for r in records if r.outcome == "error" and r.phase != "shutdown"]
    wrong = [r for r in records if r.outcome == "mismatch" or (r.outcome == "truncated" and r.phase != "shutdown")]
    report.requests, report.errors, report.mismatches = len(done), len(failed), len(wrong)
    report.error_messages = sorted({r.error for r in failed})[:10]
    report.mismatch_details = [{"seq": r.seq, "phase": r.phase, "prompt_index": r.prompt_index,
                                "outcome": r.outcome, "first_diff": r.first_diff, "tokens": r.tokens}
                               for r in wrong[:20]]
    report.latency_s = summarize(r.latency_s for r in done if r.latency_s is not None)
    report.ttft_s = summarize(r.ttft_s for r in done if r.ttft_s is not None)
    report.ttft_s["unloaded"] = unloaded_ttft
    report.tokens = sum(r.tokens for r in done)
    window = max((r.end_s for r in done), default=load_start) - load_start
    report.tokens_per_s = round(report.tokens / window, 2) if window > 0 else 0.0
    report.timeline["load_s"] = round(window, 3)
    report.machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    if sampler is not None:
        report.samples = sampler.samples
        first, last = sampler.first_metrics or {}, sampler.last_metrics or {}
        report.metrics = {"start": first, "end": last,
                          "delta": {k: round(last[k] - first.get(k, 0.0), 4) for k in last
                                    if not k.startswith(GAUGES) and last[k] != first.get(k, 0.0)}}
    report.targets = targets(report)


def targets(report: SoakReport) -> list[dict]:
    """The issue's targets, each with its value and whether it is met (only those this run measured)."""
    out = [{"name": "errors", "target": "0", "value": report.errors, "ok": report.errors == 0},
           {"name": "mismatches", "target": "0", "value": report.mismatches, "ok": report.mismatches == 0}]
    if report.memory is not None and report.memory.get("growth_pct") is not None:
        g = report.memory["growth_pct"]
        out.append({"name": "memory growth %", "target": f"< {TARGET_MEMORY_GROWTH_PCT:g}", "value": g,
                    "ok": g < TARGET_MEMORY_GROWTH_PCT})
    if report.after_load.get("checked"):
        out.append({"name": "nothing in flight after the load", "target": "0",
                    "value": report.after_load.get("trtspec_engine_sequences_in_flight"),
                    "ok": bool(report.after_load.get("in_flight_zero"))})
    if report.faults is not None:
        ratio = report.faults.get("ttft_ratio")
        out.append({"name": "TTFT after faults ÷ unloaded", "target": f"<= {TARGET_TTFT_RATIO:g}", "value": ratio,
                    "ok": ratio is not None and ratio <= TARGET_TTFT_RATIO})
        if "cancelled_delta" in report.after_load:
            want, got = report.after_load["cancelled_expected"], report.after_load["cancelled_delta"]
            out.append({"name": "faulted streams counted cancelled", "target": f">= {want}", "value": got,
                        "ok": got >= want})
    if report.shutdown is not None:
        s = report.shutdown
        out.append({"name": "shutdown exit 0 within 5 s" + (" (SIGTERM mid-load)" if s["mid_load"] else " (idle)"),
                    "target": f"0, <= {TARGET_SHUTDOWN_S:g} s", "value": f"{s['serve_exit']}, {s['seconds']:.2f} s",
                    "ok": s["serve_exit"] == 0 and s["seconds"] <= TARGET_SHUTDOWN_S})
        out.append({"name": "serve's exit status = tritonserver's", "target": "equal",
                    "value": f"{s['serve_exit']} / {s['tritonserver_exit']}",
                    "ok": s["serve_exit"] == s["tritonserver_exit"]})
        out.append({"name": "no server process left", "target": "none", "value": s["leftover_pids"],
                    "ok": not s["leftover_pids"]})
    return out


# ---- output ---------------------------------------------------------------------------------------------------

def _minutes(minutes: float) -> str:
    return f"{minutes * 60:.0f} s" if minutes < 1 else f"{minutes:g} min"


def _fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def _status_line(elapsed: float, counts: dict, sample: dict) -> str:
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
    bound = _minutes(o["minutes"]) + (f" (or {o['max_requests']} requests)" if o.get("max_requests") else "")
    lines.append(f"soak of {where} ({report.server.get('url')}): {o['users']} users x {bound}, "
                 f"{o['prompts_loaded']} prompts of {o['prompt_set']}, max_tokens {o['max_tokens']}")
    lines.append(f"  machine        {report.machine['cores']} cores, load average at start "
                 f"{' / '.join(map(str, report.machine['loadavg_start']))}, at end "
                 f"{' / '.join(map(str, report.machine.get('loadavg_end', [])))}")
    lines.append(f"  requests       {report.requests} completed in {report.timeline.get('load_s', 0):.1f} s, "
                 f"{report.errors} errors, {report.mismatches} mismatches (outputs vs each prompt served alone)")
    for name, d in (("latency", report.latency_s), ("first token", report.ttft_s)):
        lines.append(f"  {name:<14} p50 {_fmt_s(d.get('p50'))}, p90 {_fmt_s(d.get('p90'))}, "
                     f"p99 {_fmt_s(d.get('p99'))}, max {_fmt_s(d.get('max'))}"
                     + (f" (unloaded {_fmt_s(d.get('unloaded'))})" if name == "first token" else ""))
    lines.append(f"  tokens/s       {report.tokens_per_s:.1f} ({report.tokens:,} tokens)")
    m = report.memory
    if m is not None:
        procs = ", ".join(f"{k} {v:.0f}" for k, v in sorted(m["processes_end_mib"].items(), key=lambda kv: -kv[1]))
        lines.append(f"  memory (RSS)   start {m['start_mib']:.1f} MiB, peak {m['peak_mib']:.1f}, end "
                     f"{m['end_mib']:.1f}: growth {m['growth_pct']:+.2f}% (second half {m['second_half_growth_pct']:+.2f}%)"
                     f"; before the load {m['before_load_mib']} MiB")
        lines.append(f"  processes      {procs} (MiB at the end of the load)")
    else:
        lines.append("  memory         not sampled")
    a = report.after_load
    if a.get("checked"):
        lines.append(f"  after the load in flight {_num(a.get('trtspec_engine_sequences_in_flight'))}, queued "
                     f"{_num(a.get('trtspec_engine_queue_size'))}, KV rows used {_num(a.get('trtspec_kv_rows_used'))}"
                     f" / free {_num(a.get('trtspec_kv_rows_free'))} (waited {a['waited_s']:.1f} s)")
    f = report.faults
    if f is not None:
        ab, ca = f["abandon"], f["cancel"]
        lines.append(f"  faults         {ab['cut_mid_stream']}/{ab['requested']} abandoned and {ca['cut_mid_stream']}/"
                     f"{ca['requested']} cancelled mid-stream; cancelled counter +{_num(f['cancelled_counter_delta'])}; "
                     f"first token after them {_fmt_s(f['fresh_ttft_median_s'])} = {f['ttft_ratio']}x unloaded")
    s = report.shutdown
    if s is not None:
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
    for note in report.notes:
        lines.append(f"  note           {note}")
    marks = ", ".join(f"{t['name']} {t['value']} {'ok' if t['ok'] else 'MISSED'}" for t in report.targets)
    lines.append(f"  targets        {marks}")
    return lines


def _num(value) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if float(value).is_integer() else f"{value:g}"


CSV_FIELDS = [f.name for f in fields(RequestRecord)]


def write_outputs(report: SoakReport, out: Path) -> dict[str, Path]:
    """report.json, requests.csv and soak.png (when matplotlib is installed) in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"report": out / "report.json", "requests": out / "requests.csv"}
    written["report"].write_text(json.dumps(report.to_dict(), indent=1) + "\n")
    with written["requests"].open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in report.records:
            writer.writerow(asdict(r))
    try:
        plot(report, out / "soak.png")
        written["plot"] = out / "soak.png"
    except ImportError:
        report.notes.append("soak.png not written: matplotlib is not installed")
    return written


def plot(report: SoakReport, png: Path) -> None:
    """Latency and time to first token per request (top), resident memory and requests in flight (bottom), over
    the run; the load, the faults and the SIGTERM marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 6.5), sharex=True)
    for phase, colour in (("soak", "tab:blue"), ("shutdown", "tab:red"), ("probe", "tab:green")):
        rows = [r for r in report.records if r.phase == phase and r.latency_s is not None]
        if rows:
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
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
