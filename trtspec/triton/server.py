"""Find, start, watch and stop a real `tritonserver` for a model repository.

Where the server comes from, in order: `--tritonserver PATH`, `tritonserver` on PATH (the NGC container), or
the build bundled in the `nvidia-pytriton` wheel (pip install 'trtspec[serve]'). For the bundled build a
backend directory is prepared once per interpreter: the Python backend plus the stub matching this Python.
The stub's embedded interpreter ignores PYTHONPATH, so the models add the serving environment's site-packages
from TRTSPEC_SITE_PACKAGES. The server listens on loopback unless an address is given.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import ServerError, TrtspecError
from trtspec.procfs import port_owner, process_stat
from trtspec.triton.drain import DrainSignal

log = logging.getLogger(__name__)

INSTALL_HINT = ("install the bundled server with `pip install 'trtspec[serve]'` (nvidia-pytriton), or run inside "
                "an NGC Triton container (nvcr.io/nvidia/tritonserver:<yy.mm>-py3) where `tritonserver` is on PATH")


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    backend_dir: Path | None  # None: the binary's default (/opt/tritonserver/backends)
    env: dict[str, str] = field(default_factory=dict)


def _bundled() -> Path | None:
    try:
        import importlib.util

        spec = importlib.util.find_spec("pytriton")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(list(spec.submodule_search_locations)[0]) / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def _site_packages() -> list[str]:
    """Where the Python models import from: the folder of the trtspec this process runs first (a source tree on
    PYTHONPATH beats the venv's editable install, whose finder comes after sys.path), then the venv's packages."""
    import trtspec

    paths = [str(Path(trtspec.__file__).resolve().parent.parent), sysconfig.get_paths()["purelib"],
             sysconfig.get_paths()["platlib"]]
    return list(dict.fromkeys(p for p in paths if p))


def _prepare_backends(root: Path, cache: Path) -> Path:
    """A backend dir with python/ = the bundled Python backend + the stub for this interpreter."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"the bundled Triton has no Python backend stub for Python {version} ({stub})")
    target = cache / f"py{version}" / "python"
    marker = target / ".source"
    if not (marker.is_file() and marker.read_text() == str(root)):
        tmp = target.with_name(f"python.tmp-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(root / "backends" / "python", tmp)
        shutil.copy2(stub, tmp / "triton_python_backend_stub")
        (tmp / ".source").write_text(str(root))
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
    return target.parent


def find_tritonserver(binary: str | Path | None = None, *, cache: Path | None = None) -> TritonInstall:
    """Locate a server and the environment it needs; ServerError with how to get one when there is none."""
    site = os.pathsep.join(_site_packages())
    env = {"TRTSPEC_SITE_PACKAGES": site}
    if binary is not None:
        path = Path(binary)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerError(f"--tritonserver {binary}: not an executable file")
        return TritonInstall(path, None, env)
    on_path = shutil.which("tritonserver")
    if on_path:
        return TritonInstall(Path(on_path), None, env)
    root = _bundled()
    if root is None:
        raise ServerError(f"no tritonserver found (not on PATH, nvidia-pytriton not installed); {INSTALL_HINT}")
    libs = root.parent.parent / "nvidia_pytriton.libs"
    cache = cache or Path(os.environ.get("TRTSPEC_CACHE", Path.home() / ".cache" / "trtspec")) / "triton-backends"
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return TritonInstall(root / "bin" / "tritonserver", _prepare_backends(root, cache), env)


_HANDED_OUT: set[int] = set()  # ports free_port has returned in this process


def free_port(address: str = "127.0.0.1") -> int:
    """A port free on `address` now, never one this process was given before: the OS may hand the same ephemeral port
    to two binds in a row, and a server's gRPC, HTTP and metrics ports asked for one after another must differ."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind((address, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise ServerError(f"no free port on {address} that this process has not used already")


@dataclass(frozen=True, kw_only=True)
class ServerOptions:
    repository: Path
    address: str = "127.0.0.1"
    grpc_port: int = 8001
    http_port: int = 8000
    metrics_port: int = 8002
    tritonserver: Path | None = None
    log_verbose: int = 0
    exit_timeout_s: int = 30
    # on stop: how long requests in flight may run on; then the engine model ends them with an error response
    # (None: Triton's own behaviour, which waits up to exit_timeout_s and then exits 1 with them unanswered)
    drain_s: float | None = None
    startup_timeout_s: float = 180.0
    port_wait_s: float = 10.0  # how long to wait for a port still held (a server that is just stopping)
    # Triton's --metrics-interval-ms. Its metrics thread is joined at exit and sleeps half an interval at a time:
    # the default (2 s) delays every stop by up to a second; a tenth of it keeps stops quick (and refreshes
    # nv_cpu_* more often; trtspec's own gauges do not depend on it)
    metrics_interval_ms: int = 200
    extra_args: tuple[str, ...] = ()


class TritonServer:
    """A running tritonserver; use as a context manager. Its log lines go to `on_log` (default: logging)."""

    def __init__(self, options: ServerOptions, *, on_log: Callable[[str], None] | None = None):
        self.options = options
        self.on_log = on_log or (lambda line: log.info("%s", line))
        self.process: subprocess.Popen | None = None
        self.log_lines: list[str] = []
        self._reader: threading.Thread | None = None
        self._drain_dir: Path | None = None

    @property
    def grpc_url(self) -> str:
        return f"{self.options.address}:{self.options.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.options.address}:{self.options.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.options.address}:{self.options.metrics_port}/metrics"

    def command(self, install: TritonInstall) -> list[str]:
        o = self.options
        argv = [str(install.binary), f"--model-repository={Path(o.repository).resolve()}",
                f"--grpc-port={o.grpc_port}", f"--http-port={o.http_port}", f"--metrics-port={o.metrics_port}",
                f"--grpc-address={o.address}", f"--http-address={o.address}", f"--metrics-address={o.address}",
                f"--exit-timeout-secs={self.exit_timeout_s}", f"--metrics-interval-ms={o.metrics_interval_ms}",
                "--disable-auto-complete-config",
                f"--log-verbose={o.log_verbose}"]
        if install.backend_dir is not None:
            argv.append(f"--backend-directory={install.backend_dir}")
        return argv + list(o.extra_args)

    @property
    def exit_timeout_s(self) -> int:
        """Triton's --exit-timeout-secs: with a drain time, long enough for the engine model to end what is left."""
        o = self.options
        return o.exit_timeout_s if o.drain_s is None else max(o.exit_timeout_s, int(o.drain_s) + DRAIN_GRACE_S)

    def start(self) -> TritonServer:
        repo = Path(self.options.repository)
        if not (repo / "ensemble" / "config.pbtxt").is_file():
            raise ServerError(f"{repo} is not a trtspec model repository (no ensemble/config.pbtxt); "
                              "write one with `trtspec deploy ENGINE_DIR --out REPO`")
        verify_engines(repo)
        install = find_tritonserver(self.options.tritonserver)
        wait_for_ports(self.options.address, (self.options.grpc_port, self.options.http_port,
                                              self.options.metrics_port), self.options.port_wait_s)
        env = {**os.environ, **install.env}
        if self.options.drain_s is not None:
            import tempfile

            self._drain_dir = Path(tempfile.mkdtemp(prefix="trtspec-drain-"))
            env["TRTSPEC_DRAIN_FILE"] = str(self._drain_dir / "drain")
        argv = self.command(install)
        log.debug("starting %s", " ".join(argv))
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace",
                                        start_new_session=True)
        self._reader = threading.Thread(target=self._read_log, daemon=True)
        self._reader.start()
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _read_log(self) -> None:
        """Every line into log_lines; to on_log all but what tritonserver prints about the GPU it looks for on a
        CPU-only host (CPU_HOST_NOISE), which it replaces by one note once the model table is printed."""
        assert self.process is not None and self.process.stdout is not None
        left_out = 0
        for line in self.process.stdout:
            line = line.rstrip("\n")
            self.log_lines.append(line)
            if CPU_HOST_NOISE.search(line) and not log.isEnabledFor(logging.DEBUG):
                left_out += 1
                continue
            if left_out and "Collecting CPU metrics" in line:
                self.on_log(f"(trtspec leaves out tritonserver's lines about a GPU, CUDA, NVML, DCGM or pinned memory, "
                            f"{left_out} so far: this server computes on the CPU; `trtspec -v serve` shows them)")
                left_out = 0
            self.on_log(line)

    def _wait_ready(self) -> None:
        """Until the server and the ensemble are ready (HTTP health checks) and the gRPC port takes connections.
        The standard library only: a process that has imported gRPC spends ~0.3 s more exiting (`serve`'s stop)."""
        import urllib.error
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through an HTTP proxy

        def ready() -> bool:
            base = f"http://{self.http_url}/v2"
            try:
                for path in ("/health/ready", "/models/ensemble/ready"):
                    with opener.open(base + path, timeout=2) as answer:
                        if answer.status != 200:
                            return False
                with socket.create_connection((self.options.address, self.options.grpc_port), timeout=2):
                    return True
            except (OSError, urllib.error.URLError):  # not listening yet, or not ready (HTTP 400 / 503)
                return False

        deadline = time.monotonic() + self.options.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                reason = _failure_reason(self.log_lines)
                raise ServerError(f"tritonserver exited with code {self.process.returncode} while starting"
                                  f"{': ' + reason if reason else ''}")
            if ready():
                return
            time.sleep(0.25)
        raise ServerError(f"tritonserver did not become ready within {self.options.startup_timeout_s:.0f} s")

    def _drain(self) -> None:
        """Let the engine model finish what it is running (no new requests) for up to the drain time, then end the
        rest with an error response; return once it reports nothing left (or after a few seconds more)."""
        signal_ = DrainSignal(self._drain_dir / "drain")
        signal_.start()
        deadline = time.monotonic() + self.options.drain_s
        while not signal_.idle() and time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.05)
        if not signal_.idle():
            log.info("drain time over (%.1f s): ending the requests in flight", self.options.drain_s)
            signal_.end()
            deadline = time.monotonic() + DRAIN_GRACE_S / 3
            while not signal_.idle() and time.monotonic() < deadline and self.process.poll() is None:
                time.sleep(0.05)

    def stop(self, timeout: float | None = None) -> int | None:
        """With a drain time, drain the engine model first; then SIGTERM (Triton waits for what is still in flight,
        up to its exit timeout) and SIGKILL if it has not exited after that."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            if self._drain_dir is not None:
                self._drain()
            self.process.send_signal(signal.SIGTERM)
            limit = timeout if timeout is not None else self.exit_timeout_s + 10
            try:
                self.process.wait(limit)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._reader is not None:
            self._reader.join(5)
        if self._drain_dir is not None:
            shutil.rmtree(self._drain_dir, ignore_errors=True)
            self._drain_dir = None
        return self.process.returncode

    def exit_reason(self) -> str:
        """Why tritonserver exited with a non-zero status, from its log ("" when it says nothing)."""
        for line in reversed(self.log_lines):
            if line.startswith("E") and ("failed to stop server" in line or "failed" in line.lower()) \
                    and "NVML" not in line and "Cuda" not in line and "CUDA" not in line:
                return line.split("] ", 1)[-1].strip().strip('"')[:300]
        return _failure_reason(self.log_lines)

    def wait(self) -> int:
        """Until tritonserver exits. A signal (Ctrl-C, serve's SIGTERM) interrupts it at once: Popen.wait() would first
        wait another 0.25 s for the child to exit (CPython's subprocess, bpo-25942), a quarter of a second of every
        stop; waitid with WNOWAIT waits without reaping, so Popen still collects the status."""
        assert self.process is not None
        if hasattr(os, "waitid"):
            try:
                os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOWAIT)
            except ChildProcessError:  # already collected
                pass
        return self.process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def exit_status(returncode: int | None) -> int:
    """A process exit status as a shell reports it: killed by signal N → 128 + N."""
    if returncode is None:
        return 0
    return 128 - returncode if returncode < 0 else returncode


DRAIN_GRACE_S = 15  # beyond the drain time: for the engine model to answer what is left and Triton to unload


def port_is_free(address: str, port: int) -> bool:
    """Whether a server could listen on the port now. SO_REUSEADDR, as Triton's listeners use it: connections of a
    server that just stopped (TIME_WAIT) do not hold the port, a listening socket does."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((address, port))
        except OSError:
            return False
        return True


def port_holder(port: int) -> str:
    """The process listening on a TCP port, as "pid 123 (tritonserver)", from /proc (Linux); "" when unknown."""
    pid = port_owner(port)
    stat = process_stat(pid) if pid is not None else None
    return f"pid {pid} ({stat[0]})" if stat is not None else ""


def wait_for_ports(address: str, ports: tuple[int, ...], wait_s: float) -> None:
    """Return once every port is free; wait up to wait_s for one still held, then ServerError naming the holder."""
    deadline = time.monotonic() + wait_s
    for port in ports:
        if port_is_free(address, port):
            continue
        holder = port_holder(port)
        log.warning("port %d on %s is in use%s; waiting up to %.0f s", port, address,
                    f" by {holder}" if holder else "", wait_s)
        while not port_is_free(address, port):
            if time.monotonic() >= deadline:
                holder = port_holder(port) or holder
                raise ServerError(f"port {port} on {address} is in use{' by ' + holder if holder else ''}; stop "
                                  "that server or pick another port with --grpc-port / --http-port / --metrics-port")
            time.sleep(0.25)


def _failure_reason(lines: list[str]) -> str:
    for line in lines:
        if ("failed to load" in line or line.startswith("error:") or "UNAVAILABLE:" in line
                or "failed to start" in line or "already in use" in line):
            return line.strip()[:400]
    return ""


# tritonserver's lines about the GPU it looks for (Triton 2.51 on a CPU-only host): errors and warnings that say
# nothing about this server, which computes on the CPU
CPU_HOST_NOISE = re.compile(r"CUDA driver version is insufficient|CUDA memory pool disabled|CudaDriverHelper has not "
                            r"been initialized|Failed to initialize NVML|DCGM unable to start|unable to create stream "
                            r"for ensemble: CUDA|no pinned memory pool")

_ENGINE_DIR_PARAM = re.compile(r'key:\s*"engine_dir"\s*value:\s*\{\s*string_value:\s*"([^"]*)"')


def verify_engines(repo: Path) -> list[Path]:
    """Check the engine every CPU-flavour engine model of the repository loads (its `engine_dir` parameter, relative
    to the repository as the model resolves it) against its manifest's sizes and hashes, before Triton starts: a
    changed or truncated file is one line naming it, not a model that fails to load. Returns the engines checked."""
    from trtspec.engine.integrity import verify_files
    from trtspec.engine.manifest import read_manifest
    from trtspec.triton.model_args import repository_path

    checked = []
    for config in sorted(Path(repo).glob("*/config.pbtxt")):
        match = _ENGINE_DIR_PARAM.search(config.read_text(errors="replace"))
        if match is None:
            continue
        engine_dir = repository_path(repo, match.group(1))
        if engine_dir in checked:
            continue
        try:
            verify_files(engine_dir, read_manifest(engine_dir).checksums)
        except TrtspecError as e:
            raise ServerError(f"{config.parent.name}: engine_dir {match.group(1)}: {e}") from None
        checked.append(engine_dir)
    return checked
