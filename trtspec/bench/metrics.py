"""Triton's Prometheus metrics endpoint read into flat numbers: each metric summed over all its labels (`name`), and
beside that per model (`name{model="x"}`) and per slot profile (`name[N]`, trtspec_engine_profile_steps_total's
`slots` label). The one reader of `/metrics` for the benchmarks (serving mode's counters, the soak's samples)."""

from __future__ import annotations

import re
import urllib.request

PREFIXES = ("trtspec_", "nv_inference_")

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text exposition: (name, labels, value) per sample line; comments and bad lines are skipped."""
    out = []
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m:  # a blank line or a comment too
            continue
        try:
            value = float(m[3])
        except ValueError:
            continue
        out.append((m[1], dict(_LABEL.findall(m[2] or "")), value))
    return out


def flatten_metrics(text: str, prefixes: tuple[str, ...] = PREFIXES) -> dict[str, float]:
    """The samples of the metrics named with `prefixes`, summed per key (module docstring)."""
    flat: dict[str, float] = {}
    for name, labels, value in parse_metrics(text):
        if not name.startswith(prefixes):
            continue
        keys = [name]
        if "model" in labels:
            keys.append(f'{name}{{model="{labels["model"]}"}}')
        if "slots" in labels:
            keys.append(f"{name}[{labels['slots']}]")
        for key in keys:
            flat[key] = flat.get(key, 0.0) + value
    return flat


def read_metrics(url: str, *, prefixes: tuple[str, ...] = PREFIXES, timeout: float = 10.0) -> dict[str, float]:
    """`flatten_metrics` of the endpoint at `url`; OSError (urllib's URLError) when it cannot be read."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return flatten_metrics(response.read().decode("utf-8", errors="replace"), prefixes)


def fetch_metrics(url: str, timeout: float = 3.0) -> dict[str, float] | None:
    """`read_metrics`, or None when the endpoint cannot be read (a sampler must not fail with the server)."""
    try:
        return read_metrics(url, timeout=timeout)
    except (OSError, ValueError):
        return None


def read_counters(metrics_url: str, *, publish_via: str | None = None) -> dict[str, float]:
    """trtspec's counters (`flatten_metrics`). The engine model publishes them when it receives a request, so
    `publish_via` (a gRPC URL) sends a one-token request first: the counters then cover everything before this."""
    if publish_via is not None:
        from trtspec.speculative.loop import GenerationConfig
        from trtspec.triton.client import TritonClient

        with TritonClient(publish_via) as client:
            client.generate("count", GenerationConfig(max_tokens=1))
    return read_metrics(metrics_url, prefixes=("trtspec_",))


def engine_batching(before: dict, after: dict) -> dict:
    """Verify steps the engine ran between two `read_counters` and the sequences it batched per step."""
    delta = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    steps = delta.get("trtspec_engine_steps_total", 0.0)
    sequences = delta.get("trtspec_engine_step_sequences_total", 0.0)
    return {"steps": int(steps), "sequences_per_step": round(sequences / steps, 2) if steps else None}
