"""A soak of a served deployment: N users streaming real prompts for M minutes, every greedy output checked against
the prompt served alone, the server's memory and `/metrics` sampled, faults injected on request. The order of a run,
its modes, memory growth and the targets: docs/serving-faults.md; the report and its files: bench.soak_report.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from trtspec.bench.metrics import fetch_metrics
from trtspec.bench.soak_report import (SoakReport, SoakRequest, format_minutes, format_seconds, memory_summary,
                                       status_line, summarize, targets, write_outputs)
from trtspec.bench.summary import first_divergence
from trtspec.errors import ConfigError, ServerError
from trtspec.procfs import alive, cmdline, port_owner, process_stat, process_tree, rss_kib
from trtspec.speculative.loop import GenerationConfig
from trtspec.triton.client import TritonClient, first_line

PROBE_TOKENS = 16  # the time-to-first-token probe (unloaded, and again after the faults)
PROBES = 3
FAULT_FIRST_TOKEN_WAIT_S = 60.0  # how long a fault stream may take to its first token before it counts as failed
SETTLE_S = 10.0  # after the load: how long the gauges may take to show nothing in flight
WARMUP_SHARE = 0.1  # memory "start": not before this share of the load is over (caches and arenas grow first)
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


# ---- pure helpers ---------------------------------------------------------------------------------------------

def _median(values: Iterable[float | None]) -> float | None:
    xs = [x for x in values if x is not None]
    return statistics.median(xs) if xs else None


def compare(output: list[int], reference: list[int]) -> tuple[str, int | None]:
    """ok; truncated (a strict prefix of the reference: the stream ended early); mismatch, with the first index
    that differs (tokens of another stream, or a different greedy choice)."""
    if output == reference:
        return "ok", None
    diff = first_divergence(output, reference)
    return ("truncated" if diff == len(output) else "mismatch"), diff


def process_label(pid: int) -> str:
    """tritonserver; stub:MODEL for a Python backend stub (the model folder of its model.py); else its comm."""
    argv = cmdline(pid)
    if argv and "triton_python_backend_stub" in argv[0]:
        parts = Path(next((arg for arg in argv[1:] if arg.endswith(".py")), "")).parts
        return f"stub:{parts[-3]}" if len(parts) >= 3 else "stub"
    stat = process_stat(pid)
    return stat[0] if stat else "?"


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


# ---- sampling -------------------------------------------------------------------------------------------------

class Sampler:
    """Every `interval` seconds: RSS of the server process tree and the trtspec / nv_inference metrics."""

    def __init__(self, root_pid: int | None, metrics_url: str | None, *, interval: float = 1.0,
                 epoch: float | None = None):
        self.root_pid, self.metrics_url, self.interval = root_pid, metrics_url, interval
        self.epoch = time.monotonic() if epoch is None else epoch
        self.samples: list[dict] = []
        self.first_metrics: dict[str, float] | None = None
        self.last_metrics: dict[str, float] | None = None
        self.pids_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> dict:
        entry: dict = {"t": round(time.monotonic() - self.epoch, 3)}
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
            if (metrics := fetch_metrics(self.metrics_url)) is not None:
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
                self.samples.append({"t": round(time.monotonic() - self.epoch, 3), "error": first_line(e, 300)})

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


# ---- the server under test ------------------------------------------------------------------------------------

class ServeProcess:
    """`trtspec serve REPO` run as a user runs it (a subprocess, on free loopback ports), not a TritonServer: the
    soak measures serve's own stop (its exit status, how long it takes), and keeps its stderr, each line timed."""

    def __init__(self, repo: Path, *, drain_s: float = 1.0):
        from trtspec.triton.server import free_port

        self.repo, self.drain_s = Path(repo), drain_s
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self.grpc_url, self.metrics_url = f"127.0.0.1:{self.grpc_port}", f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.process: subprocess.Popen | None = None
        self.lines: deque[tuple[float, str]] = deque(maxlen=20000)  # (time.monotonic() it arrived, line)
        self.ready = threading.Event()
        self.tritonserver_pid: int | None = None
        self._reader: threading.Thread | None = None

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
                tail = " | ".join(line for _, line in list(self.lines)[-3:])
                raise ServerError(f"`trtspec serve {self.repo}` exited with status {self.process.returncode} while "
                                  f"starting: {tail}")
            if time.monotonic() > deadline:
                self.kill()
                raise ServerError(f"`trtspec serve {self.repo}` was not ready within {timeout_s:.0f} s")
        for _ in range(40):
            self.tritonserver_pid = port_owner(self.grpc_port)
            if self.tritonserver_pid is not None:
                break
            time.sleep(0.25)
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            if line.startswith("serving "):
                self.ready.set()

    def tritonserver_status(self) -> int | None:
        """tritonserver's exit status as `serve` reported it on stderr (None when it said nothing)."""
        for _, line in reversed(list(self.lines)):
            if m := re.match(r"(?:tritonserver exited \(|Error: tritonserver exited with status )(\d+)", line):
                return int(m[1])
        return None

    def sigterm(self, pids: Iterable[int] = ()) -> dict:
        """SIGTERM `serve`; wait for it (its drain time and then some), SIGKILL its session after that. Returns the
        seconds it took, its exit status, tritonserver's, and any process of the server left alive."""
        from trtspec.triton.server import exit_status

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
        after = [(t - start, line) for t, line in list(self.lines) if t >= start]
        first = lambda text: next((round(t, 3) for t, line in after if text in line), None)  # noqa: E731
        time.sleep(0.2)
        leftover = sorted(p for p in set(pids) | {self.tritonserver_pid or 0} if p and alive(p))
        return {"seconds": round(took, 3), "serve_exit": exit_status(self.process.returncode),
                "tritonserver_exit": self.tritonserver_status(), "killed_after_timeout": killed,
                "leftover_pids": leftover,
                # from serve's stderr: when its drain time ran out (None: everything finished within it), when
                # Triton began unloading and when it found no model left
                "drain_over_after_s": first("drain time over"),
                "first_unload_after_s": first("successfully unloaded"),
                "no_live_models_after_s": first("Found 0 live models"),
                "last_log_lines": [line for _, line in list(self.lines)[-8:]]}

    def write_log(self, out: Path, epoch: float) -> None:
        """serve.log in `out`: serve's stderr, each line after the second of the soak it arrived at."""
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "serve.log").write_text("".join(f"[{t - epoch:9.3f}] {line}\n" for t, line in list(self.lines)))

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        if self.tritonserver_pid is not None and alive(self.tritonserver_pid):
            with contextlib.suppress(OSError):  # serve killed before it stopped tritonserver (a session of its own)
                os.killpg(self.tritonserver_pid, signal.SIGKILL)


# ---- load -----------------------------------------------------------------------------------------------------

def _request(client, prompt: str, max_tokens: int, reference: list[int], record: SoakRequest, **generate) -> None:
    """One greedy request on `client`: its times, tokens and outcome against `reference` into `record`."""
    g = client.generate(prompt, GenerationConfig(max_tokens=max_tokens), **generate)
    record.ttft_s = round(g.ttft_s, 5) if g.output_ids else None
    record.latency_s = round(g.total_s, 5)
    record.tokens, record.finish_reason = len(g.output_ids), g.finish_reason
    record.outcome, record.first_diff = compare(g.output_ids, reference)


class Load:
    """`users` threads, each its own gRPC connection and stream, sending prompts round robin until stopped or
    `max_requests` were started; every completed output compared with its prompt's reference."""

    def __init__(self, url: str, prompts: list[str], references: list[list[int]], *, users: int, max_tokens: int,
                 phase: str, epoch: float, model: str = "ensemble", max_requests: int | None = None,
                 request_timeout_s: float = 300.0, first_seq: int = 0, stop_on_error: bool = False):
        self.url, self.prompts, self.references, self.users = url, prompts, references, users
        self.max_tokens, self.phase, self.epoch, self.model = max_tokens, phase, epoch, model
        self.max_requests, self.request_timeout_s, self.stop_on_error = max_requests, request_timeout_s, stop_on_error
        self.records: list[SoakRequest] = []
        self.stopping = threading.Event()
        self.exhausted = threading.Event()  # max_requests were started
        self.warm_at: float | None = None  # when every user had finished a request
        self.first_token = [threading.Event() for _ in range(users)]
        self.next_seq, self._first_seq = first_seq, first_seq
        self._lock = threading.Lock()
        self._done_users: set[int] = set()
        self._threads: list[threading.Thread] = []

    def now(self) -> float:
        return time.monotonic() - self.epoch

    def _take(self) -> int | None:
        with self._lock:
            if self.stopping.is_set() or self.exhausted.is_set():
                return None
            seq = self.next_seq
            self.next_seq += 1
            if self.max_requests is not None and self.next_seq - self._first_seq >= self.max_requests:
                self.exhausted.set()
            return seq

    def _user(self, user: int) -> None:
        client = None
        try:
            while (seq := self._take()) is not None:
                index = seq % len(self.prompts)
                record = SoakRequest(seq, user, self.phase, index, round(self.now(), 4))
                try:
                    if client is None:
                        client = TritonClient(self.url, model=self.model, timeout_s=self.request_timeout_s)
                    _request(client, self.prompts[index], self.max_tokens, self.references[index], record,
                             index=index, on_text=lambda _piece, u=user: self.first_token[u].set())
                except Exception as e:  # noqa: BLE001: every failure is a counted error of this request
                    record.outcome, record.error = "error", first_line(e, 300)
                    _close_quietly(client)
                    client = None
                    self.stopping.wait(0.5)  # a server that is gone must not turn into thousands of errors a second
                else:
                    self.first_token[user].set()
                record.end_s = round(self.now(), 4)
                with self._lock:
                    self.records.append(record)
                    if record.outcome != "error":
                        self._done_users.add(user)
                        if len(self._done_users) == self.users and self.warm_at is None:
                            self.warm_at = record.end_s
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
            outcomes = [r.outcome for r in self.records]
        errors = outcomes.count("error")
        return {"requests": len(outcomes) - errors, "errors": errors,
                "mismatches": outcomes.count("mismatch") + outcomes.count("truncated")}


def _close_quietly(client, timeout: float = 10.0) -> None:
    """Close a client without waiting on a broken stream for ever."""
    if client is None:
        return

    def close():
        with contextlib.suppress(Exception):
            client.close()

    t = threading.Thread(target=close, daemon=True)
    t.start()
    t.join(timeout)


# ---- faults ---------------------------------------------------------------------------------------------------

def _fault_stream(client: TritonClient, prompt: str, max_tokens: int, on_event: Callable[..., bool | None]) -> None:
    """One fault stream on `client`: on_event("first") at its first token, whose answer says whether to cut it there
    (leaving the stream cancels it on the server); on_event("final") when it ended by itself, ("error", message)
    otherwise."""
    try:
        with contextlib.closing(client.stream(prompt, GenerationConfig(max_tokens=max_tokens))) as responses:
            for _ in responses:
                if on_event("first"):
                    return
        on_event("final")
    except Exception as e:  # noqa: BLE001: a failed fault stream is counted, not raised
        on_event("error", first_line(e, 300))
    finally:
        _close_quietly(client)


ABANDON_CHILD = "import sys; from trtspec.bench.soak import abandoning_client; abandoning_client(sys.argv[1])"


def abandoning_client(spec_json: str) -> None:
    """The child process of one --abandon stream: prints `first I` at its first token (`error I MESSAGE` / `final I`
    otherwise), then waits to be killed with the stream open, its connection dropped as a crashed client's is."""
    spec = json.loads(spec_json)

    def say(event: str, message: str = "") -> None:
        print(f"{event} {spec['index']} {message}".rstrip(), flush=True)
        time.sleep(600)  # killed long before (at "first": with the stream open)
        os._exit(3)

    accepted = spec["accepted"]
    client = TritonClient(spec["url"], model=spec["model"], inputs=set(accepted) if accepted is not None else None)
    _fault_stream(client, spec["prompt"], spec["max_tokens"], say)


class FaultStreams:
    """--abandon streams (one child process each, SIGKILLed) and --cancel streams (cancelled by this process), started
    together; each is cut as soon as it has sent its first token (its row then goes to a fault stream still queued:
    more streams than batch rows all get cut mid-stream), and `cut()` ends what is left (failed, or the wait over)."""

    def __init__(self, url: str, prompts: list[str], *, abandon: int, cancel: int, max_tokens: int, model: str,
                 epoch: float, accepted: set[str] | None = None):
        self.url, self.prompts, self.abandon, self.cancel = url, prompts, abandon, cancel
        self.accepted = accepted  # the model's input names (build_inputs adapts the request to them)
        self.max_tokens, self.model, self.epoch = max_tokens, model, epoch
        self.state: dict[str, dict[int, str]] = {"abandon": {}, "cancel": {}}  # first / final / error
        self.errors: list[str] = []
        self._changed = threading.Condition()
        self._children: dict[int, subprocess.Popen] = {}
        self._clients: dict[int, TritonClient] = {}
        self._cut: dict[str, set[int]] = {"abandon": set(), "cancel": set()}
        self.started_at = self.cut_at = None

    def _mark(self, kind: str, i: int, event: str, message: str = "") -> None:
        with self._changed:
            previous = self.state[kind].get(i)
            if event != "first" and (i in self._cut[kind] or (event == "error" and self.cut_at is not None)):
                return  # cut: whatever ends the stream now ("Locally cancelled by application!") is the cut's doing
            if event == "error":
                self.errors.append(f"{kind} {i}: {message}")
            if previous is None or (event, previous) == ("final", "first"):
                self.state[kind][i] = event
            self._changed.notify_all()

    def _on_cancel_stream(self, i: int, event: str, message: str = "") -> bool:
        """At its first token a --cancel stream is cut: its own thread leaves the stream."""
        self._mark("cancel", i, event, message)
        if event == "first":
            with self._changed:
                self._cut["cancel"].add(i)
        return event == "first"

    def start(self) -> FaultStreams:
        self.started_at = time.monotonic() - self.epoch
        accepted = sorted(self.accepted) if self.accepted is not None else None
        for i in range(self.abandon):
            spec = {"url": self.url, "model": self.model, "max_tokens": self.max_tokens, "index": i,
                    "prompt": self.prompts[i % len(self.prompts)], "accepted": accepted}
            self._children[i] = subprocess.Popen([sys.executable, "-c", ABANDON_CHILD, json.dumps(spec)],
                                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
                                                 start_new_session=True)
            threading.Thread(target=self._read_child, args=(i,), name=f"soak-abandon-{i}", daemon=True).start()
        for i in range(self.cancel):
            self._clients[i] = TritonClient(self.url, model=self.model, inputs=self.accepted)
            threading.Thread(target=_fault_stream, name=f"soak-cancel-{i}", daemon=True, args=(
                self._clients[i], self.prompts[(self.abandon + i) % len(self.prompts)], self.max_tokens,
                partial(self._on_cancel_stream, i))).start()
        return self

    def _cancel(self, i: int) -> None:
        """Cut cancel stream i from this thread (it had no first token when the wait was over)."""
        with self._changed:
            if i in self._cut["cancel"]:
                return
            self._cut["cancel"].add(i)
            client = self._clients[i]
        try:
            client.cancel()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"cancel: {first_line(e, 300)}")

    def _read_child(self, i: int) -> None:
        """Abandon stream i: its child process is SIGKILLed once the stream sent its first token."""
        child = self._children[i]
        assert child.stdout is not None
        for line in child.stdout:
            parts = line.strip().split(" ", 2)
            if len(parts) >= 2 and parts[1].isdigit():
                self._mark("abandon", i, parts[0], parts[2] if len(parts) > 2 else "")
                if parts[0] == "first":
                    self._kill(i)
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            return
        if child.returncode != -signal.SIGKILL:  # the child died before it was killed
            self._mark("abandon", i, "error", f"the abandoning client exited with {child.returncode}")

    def _kill(self, i: int) -> None:
        with self._changed:
            self._cut["abandon"].add(i)
        child = self._children[i]
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)

    def wait_first_tokens(self, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: len(self.state["abandon"]) >= self.abandon
                                          and len(self.state["cancel"]) >= self.cancel, timeout)

    def cut(self) -> None:
        """End every fault stream not cut yet (those without a first token: failed, or the wait was over)."""
        self.cut_at = time.monotonic() - self.epoch
        self.kill()
        for i in list(self._clients):
            self._cancel(i)

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
           timeout: float, tokens: int = PROBE_TOKENS) -> SoakRequest:
    """One short request alone: its time to first token, and its tokens against the reference's first ones."""
    record = SoakRequest(seq, -1, "probe", 0, round(time.monotonic() - epoch, 4))
    try:
        with TritonClient(url, model=model, timeout_s=timeout) as client:
            _request(client, prompt, tokens, reference[:tokens], record)
    except Exception as e:  # noqa: BLE001
        record.outcome, record.error = "error", first_line(e, 300)
    record.end_s = round(time.monotonic() - epoch, 4)
    return record


def _validate(options: SoakOptions) -> None:
    if (options.url is None) == (options.repo is None):
        raise ConfigError("give either URL (a running server's gRPC HOST:PORT) or --repo REPO (served by the soak)")
    for name, least in (("users", 1), ("max_tokens", 1), ("prompts", 1), ("fault_max_tokens", 1), ("abandon", 0),
                        ("cancel", 0), ("max_requests", 1)):
        if (value := getattr(options, name)) is not None and value < least:  # max_requests None: no bound
            raise ConfigError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if not options.minutes > 0:
        raise ConfigError(f"--minutes must be > 0, got {options.minutes}")
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
    """One soak run (docs/serving-faults.md), its files into options.out if given."""
    from trtspec.data.prompts import load_prompts

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
    probes: list[SoakRequest] = []
    try:
        if options.repo is not None:
            show(f"starting `trtspec serve {options.repo}` on free loopback ports ...")
            served = ServeProcess(options.repo, drain_s=options.drain_s).start()
            url, metrics_url, pid = served.grpc_url, served.metrics_url, served.tritonserver_pid
            report.server.update(mode="repo", repo=str(options.repo), argv=served.argv()[1:])
            report.timeline["startup_s"] = round(now(), 3)
        else:
            url = options.url
            host, port = split_url(url)
            metrics_url = options.metrics_url or f"http://{'[' + host + ']' if ':' in host else host}:8002/metrics"
            pid = options.server_pid if options.server_pid is not None else (
                port_owner(port) if is_loopback(host) else None)
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
        references = []
        started = now()
        with TritonClient(url, model=options.model, timeout_s=options.request_timeout_s) as client:
            for i, prompt in enumerate(prompts):
                try:
                    references.append(client.generate(prompt, GenerationConfig(max_tokens=options.max_tokens),
                                                      index=i).output_ids)
                except ServerError as e:
                    raise ServerError(f"reference for prompt {i} failed: {e}") from None
        report.timeline["references_s"] = round(now() - started, 3)
        report.timeline["reference_tokens"] = sum(map(len, references))

        # the unloaded time to first token
        probe_tokens = min(PROBE_TOKENS, options.max_tokens)
        probes += [_probe(url, options.model, prompts[0], references[0], epoch, -1 - i, options.request_timeout_s,
                          probe_tokens) for i in range(PROBES)]
        unloaded = [p.ttft_s for p in probes if p.ttft_s is not None]
        unloaded_ttft = _median(unloaded)

        # the load
        def new_load(**kw) -> Load:
            loads.append(Load(url, prompts, references, users=options.users, max_tokens=options.max_tokens,
                              epoch=epoch, model=options.model, request_timeout_s=options.request_timeout_s, **kw))
            return loads[-1]

        load_s = options.minutes * 60
        bound = format_minutes(options.minutes) + (f" or {options.max_requests} requests"
                                                   if options.max_requests else "")
        show(f"load: {options.users} users, {bound}; unloaded time to first token "
             f"{format_seconds(unloaded_ttft)} (median of {len(unloaded)})")
        load = new_load(phase="soak", max_requests=options.max_requests)
        load_start = now()
        report.timeline["load_start_t"] = round(load_start, 3)
        load.start()
        next_status = load_start + options.status_every_s
        while now() < load_start + load_s and not load.exhausted.is_set() and load.running():
            time.sleep(min(0.25, max(0.0, load_start + load_s - now())))
            if now() >= next_status:
                next_status += options.status_every_s
                show("  " + status_line(now() - load_start, load.counts(), sampler.latest()))
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
        cut = sum(faults.summary()[k]["cut_mid_stream"] for k in ("abandon", "cancel")) if faults else 0
        report.after_load = settle = _settle(metrics_url, before_faults, cut, epoch)
        if faults is not None:
            median = _median(p.ttft_s for p in fresh)
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

        if served is not None:
            _stop(served, options, report, lambda: new_load(phase="shutdown", max_requests=options.users,
                                                           first_seq=load.next_seq, stop_on_error=True),
                  sampler, epoch, show)
            served = None
        sampler.stop()
    except BaseException:
        if served is not None and options.out is not None:
            served.write_log(options.out, epoch)
        raise
    finally:
        if faults is not None:
            faults.kill()
        for each in loads:
            each.stop()
        if sampler is not None:
            sampler.stop()
        if served is not None:
            served.kill()

    _fill(report, loads, probes, sampler, unloaded_ttft, load_start)
    if options.out is not None:
        write_outputs(report, Path(options.out))
    return report


def _stop(served: ServeProcess, options: SoakOptions, report: SoakReport, new_load: Callable[[], Load],
          sampler: Sampler, epoch: float, show: Callable[[str], None]) -> None:
    """SIGTERM `serve`: with --sigterm once a fresh load of one request per user is streaming, else idle; fills
    report.shutdown."""
    stop_load, streams, streaming = None, 0, 0
    if options.sigterm:
        show(f"shutdown: {options.users} users again, SIGTERM to serve once each has its first token ...")
        stop_load = new_load().start()
        # every user streaming, or (more users than the engine has rows) the first one done
        deadline = time.monotonic() + SIGTERM_FIRST_TOKEN_WAIT_S
        while time.monotonic() < deadline and not all(e.is_set() for e in stop_load.first_token) \
                and not stop_load.records:
            time.sleep(0.05)
        stop_load.stop()  # no new request after the signal
        streaming = sum(e.is_set() for e in stop_load.first_token) - len(stop_load.records)
        streams = options.users - len(stop_load.records)
    sigterm_t = time.monotonic() - epoch
    shutdown = served.sigterm(set(sampler.pids_seen))
    records = stop_load.records if stop_load is not None else []
    shutdown["last_request_end_after_s"] = round(max(r.end_s for r in records) - sigterm_t, 3) if records else None
    if options.out is not None:
        served.write_log(options.out, epoch)
    if stop_load is not None:
        stop_load.join(30)
    outcomes = [r.outcome for r in records]
    report.shutdown = {"mid_load": options.sigterm, "requests_open_at_sigterm": streams,
                       "streaming_at_sigterm": streaming, "sigterm_t": round(sigterm_t, 3), **shutdown,
                       "completed": outcomes.count("ok"), "ended_early": outcomes.count("truncated"),
                       "errors": outcomes.count("error"), "mismatches": outcomes.count("mismatch"),
                       "error_messages": sorted({r.error for r in records if r.error})[:5]}


def _settle(metrics_url: str | None, before: dict | None, expected_cancelled: int, epoch: float) -> dict:
    """Poll the gauges until nothing is in flight or queued, no KV row is used and (after faults) the cancelled
    counter grew by the streams cut mid-stream; up to SETTLE_S."""
    if metrics_url is None:
        return {"checked": False}
    start = time.monotonic()
    while True:
        metrics = fetch_metrics(metrics_url) or {}
        if "trtspec_engine_sequences_in_flight" not in metrics:
            return {"checked": False, "note": "the server publishes no trtspec_engine_sequences_in_flight gauge"}
        delta = metrics.get("trtspec_requests_cancelled_total", 0.0) - (before or {}).get(
            "trtspec_requests_cancelled_total", 0.0)
        idle = all(metrics.get(g, 0.0) == 0 for g in GAUGES[:3])
        if idle and (before is None or delta >= expected_cancelled) or time.monotonic() - start > SETTLE_S:
            break
        time.sleep(0.25)
    out = {"checked": True, "in_flight_zero": idle, "waited_s": round(time.monotonic() - start, 3),
           "t": round(time.monotonic() - epoch, 3), **{g: metrics.get(g) for g in GAUGES}}
    if before is not None:
        out["cancelled_delta"] = delta
        out["cancelled_expected"] = expected_cancelled
    return out


def _fill(report: SoakReport, loads: list[Load], probes: list[SoakRequest], sampler: Sampler | None,
          unloaded_ttft: float | None, load_start: float) -> None:
    records = sorted([r for load in loads for r in load.records] + probes, key=lambda r: (r.start_s, r.seq))
    report.records = records
    done = [r for r in records if r.phase == "soak" and r.outcome != "error"]
    failed = [r for r in records if r.outcome == "error" and r.phase != "shutdown"]
    wrong = [r for r in records if r.outcome == "mismatch" or (r.outcome == "truncated" and r.phase != "shutdown")]
    report.requests, report.errors, report.mismatches = len(done), len(failed), len(wrong)
    report.error_messages = sorted({r.error for r in failed})[:10]
    report.mismatch_details = [{"seq": r.seq, "phase": r.phase, "prompt_index": r.prompt_index,
                                "outcome": r.outcome, "first_diff": r.first_diff, "tokens": r.tokens}
                               for r in wrong[:20]]
    report.latency_s = summarize(r.latency_s for r in done if r.latency_s is not None)
    report.ttft_s = {**summarize(r.ttft_s for r in done if r.ttft_s is not None), "unloaded": unloaded_ttft}
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


