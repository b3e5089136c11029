"""The figures of a requests-mode `trtspec bench` run from its per-request records, as vLLM's `bench serve` defines
them where it has them: TTFT, TPOT = (end to end − TTFT) ÷ (output tokens − 1), ITL = the gaps between streamed
chunks (a speculative step's carries τ tokens: ITL grows with τ while TPOT falls), throughputs over the group's wall
time (a category's: its summed latency ÷ the concurrency), speedup over plain decoding on the same prompts and
concurrency; τ and acceptance as `trtspec.speculative.stats` defines them. Also what every bench command's tables,
CSV files and plots share: `num`, `write_csv`, `subplots` and `save_figure`.
"""

from __future__ import annotations

import csv
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from trtspec.speculative.stats import SpecStats
from trtspec.speculative.method import PLAIN

PERCENTILES = (50, 90, 99)


@dataclass
class RequestRecord:
    """One request of the run: a row of requests.csv (`itl_ms`, `stats` and `output_ids` stay in memory)."""

    concurrency: int
    method: str
    prompt_id: str
    category: str
    input_tokens: int
    output_tokens: int
    ttft_ms: float
    tpot_ms: float | None
    itl_ms_mean: float | None
    e2e_ms: float
    steps: int
    draft_tokens: int
    accepted_tokens: int
    tau: float
    finish_reason: str
    identical: bool | None  # its output equals plain decoding's of the same prompt (T = 0 only)
    target: str = ""  # serving mode: "in-process" or "served"
    itl_ms: tuple[float, ...] = ()
    stats: SpecStats | None = None
    output_ids: tuple[int, ...] = ()
    request_rate: float | None = None  # an open-loop level: Poisson arrivals at this many per second (concurrency 0)


CSV_FIELDS = [name for name in RequestRecord.__dataclass_fields__ if name not in ("itl_ms", "stats", "output_ids")]
# --goodput: the SLOs a request must meet to count (vLLM's `--goodput ttft:MS tpot:MS e2el:MS`), RequestRecord fields
SLO_FIELDS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}


def record(concurrency: int, method: str, prompt, timed, target: str = "",
           request_rate: float | None = None) -> RequestRecord:
    """A request's row from its prompt and what the target timed (`workload.Timed`)."""
    itl = [1000 * x for x in timed.itl_s]
    tpot = timed.tpot_s
    input_tokens = len(prompt.ids) if prompt.ids else (timed.input_tokens or 0)
    return RequestRecord(concurrency, method, prompt.id, prompt.category, input_tokens, len(timed.output_ids),
                         round(1000 * timed.ttft_s, 3), None if tpot is None else round(1000 * tpot, 3),
                         round(float(np.mean(itl)), 3) if itl else None, round(1000 * timed.total_s, 3),
                         timed.stats.steps, timed.stats.draft_tokens, timed.stats.accepted_tokens,
                         round(timed.stats.acceptance_length, 4), timed.finish_reason, None, target,
                         tuple(round(x, 3) for x in itl), timed.stats, tuple(timed.output_ids), request_rate)


def mark_identical(records: list[RequestRecord]) -> None:
    """Set `identical` on every record: its output equals plain decoding's of the same prompt at the same load."""
    plain = {(r.concurrency, r.request_rate, r.prompt_id): r.output_ids for r in records if r.method == PLAIN}
    for r in records:
        key = (r.concurrency, r.request_rate, r.prompt_id)
        r.identical = r.output_ids == plain[key] if key in plain else None


def write_csv(f, records: list, fields: list[str]) -> None:
    """Dataclass records into the open file `f` as CSV rows of `fields` (their other fields left out)."""
    writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(asdict(r) for r in records)


def num(value, digits: int = 1) -> str:
    """A table's figure: `digits` decimals, "-" for None."""
    return "-" if value is None else f"{value:.{digits}f}"


def subplots(*args, **kwargs):
    """`matplotlib.pyplot.subplots` on the Agg backend (files only, no display): every bench plot's figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def save_figure(fig, png: Path, dpi: int = 100) -> None:
    """`fig`, laid out, into the PNG file `png`; then closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(png, dpi=dpi, format="png")
    plt.close(fig)


def first_divergence(output, reference) -> int:
    """The first index where two token sequences differ; the shorter one's length where it is a prefix of the other."""
    n = min(len(output), len(reference))
    return next((i for i in range(n) if output[i] != reference[i]), n)


def distribution(values: list[float]) -> dict | None:
    """Mean and p50 / p90 / p99 of a list of milliseconds (None when empty)."""
    if not values:
        return None
    return {"mean": round(float(np.mean(values)), 3),
            **{f"p{p}": round(float(np.percentile(values, p)), 3) for p in PERCENTILES}}


def group_figures(records: list[RequestRecord], duration_s: float) -> dict:
    """Every figure of one group of requests (a method at a concurrency, overall or one category)."""
    stats = SpecStats()
    for r in records:
        stats = stats.merge(r.stats or SpecStats())
    tokens = sum(r.output_tokens for r in records)
    decode_s = sum(r.e2e_ms - r.ttft_ms for r in records) / 1000
    checked = [r.identical for r in records if r.identical is not None]
    return {
        "requests": len(records), "input_tokens": sum(r.input_tokens for r in records), "output_tokens": tokens,
        "duration_s": round(duration_s, 3),
        "request_throughput": round(len(records) / duration_s, 3) if duration_s else 0.0,
        "output_tokens_per_s": round(tokens / duration_s, 2) if duration_s else 0.0,
        "tokens_per_s_per_user": round(float(np.mean([1000 * r.output_tokens / r.e2e_ms for r in records])), 2),
        "decode_tokens_per_s": round((tokens - len(records)) / decode_s, 2) if decode_s > 0 else 0.0,
        "ttft_ms": distribution([r.ttft_ms for r in records]),
        "tpot_ms": distribution([r.tpot_ms for r in records if r.tpot_ms is not None]),
        "itl_ms": distribution([x for r in records for x in r.itl_ms]),
        "e2e_ms": distribution([r.e2e_ms for r in records]),
        "tau": round(stats.acceptance_length, 3), "acceptance_rate": round(stats.acceptance_rate, 3),
        "per_position_acceptance": [round(x, 3) for x in stats.per_position_acceptance],
        "draft_tokens": stats.draft_tokens, "accepted_tokens": stats.accepted_tokens, "steps": stats.steps,
        "draft_share": round(stats.draft_s / decode_s, 4) if decode_s > 0 else 0.0,
        "steps_per_profile": {str(k): v for k, v in sorted(stats.profile_steps.items())},
        "identical": f"{sum(checked)}/{len(checked)}" if checked else None,
    }


def summarize(records: list[RequestRecord], walls: dict[tuple[int, str], float]) -> dict:
    """{concurrency: {method: {"overall": figures, "categories": {category: figures}}}}, with speedups over plain;
    `walls[(concurrency, method)]` sums the wall time of that method's groups."""
    out: dict = {}
    for (concurrency, method), wall in walls.items():
        mine = [r for r in records if r.concurrency == concurrency and r.method == method]
        groups = {c: [r for r in mine if r.category == c] for c in dict.fromkeys(r.category for r in mine)}
        categories = {c: group_figures(g, sum(r.e2e_ms for r in g) / 1000 / concurrency) for c, g in groups.items()}
        out.setdefault(concurrency, {})[method] = {"overall": group_figures(mine, wall), "categories": categories}
    for methods in out.values():
        plain = methods.get(PLAIN)
        for figures in methods.values():
            for name, group in [("overall", figures["overall"]), *figures["categories"].items()]:
                base = plain["overall"] if name == "overall" else plain["categories"].get(name) if plain else None
                group["speedup"] = ratio(group["output_tokens_per_s"], base and base["output_tokens_per_s"])
                group["decode_speedup"] = ratio(group["decode_tokens_per_s"], base and base["decode_tokens_per_s"])
    return out


def summarize_open_loop(records: list[RequestRecord], walls: dict[tuple[float, str], float],
                        slos: dict[str, float]) -> dict:
    """{rate: {method: figures}} of the open-loop levels, with the speedup over plain at the same rate and, given SLOs
    in ms ({"ttft": 500, ...}), the goodput: requests per second that met them all."""
    out: dict = {}
    for (rate, method), wall in walls.items():
        mine = [r for r in records if r.request_rate == rate and r.method == method]
        figures = group_figures(mine, wall)
        if slos:
            good = [r for r in mine if all(getattr(r, SLO_FIELDS[k]) is not None and getattr(r, SLO_FIELDS[k]) <= v
                                           for k, v in slos.items())]
            figures["goodput"] = round(len(good) / wall, 3) if wall else 0.0
            figures["met_slos"] = f"{len(good)}/{len(mine)}"
        out.setdefault(rate, {})[method] = figures
    for methods in out.values():
        plain = methods.get(PLAIN)
        for figures in methods.values():
            figures["speedup"] = ratio(figures["output_tokens_per_s"], plain and plain["output_tokens_per_s"])
    return out


def parse_slos(text: str | None) -> dict[str, float]:
    """--goodput ttft:500,tpot:50,e2el:4000 → {"ttft": 500.0, ...} (milliseconds)."""
    from trtspec.errors import ConfigError

    if not text:
        return {}
    slos = {}
    for part in text.split(","):
        name, _, value = part.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if name.strip() not in SLO_FIELDS or not number > 0:
            raise ConfigError(f"--goodput {text}: expected NAME:MS pairs with NAME one of {', '.join(SLO_FIELDS)} "
                              f"and MS > 0, e.g. ttft:500,tpot:50 (got {part!r})")
        slos[name.strip()] = number
    return slos


def ratio(a: float, b: float | None) -> float | None:
    """a ÷ b to three places; None without a b."""
    return round(a / b, 3) if b else None
