"""What a requests-mode `trtspec bench` run leaves: the table it prints (after `vllm bench serve`'s) and in --out
summary.json, requests.csv and the plots, each titled with what was measured."""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench.runner import BenchRun
from trtspec.bench.summary import CSV_FIELDS, PLAIN, num, save_figure, subplots, write_csv

RULE = 50


def format_table(report: dict) -> list[str]:
    """The run's header, one row per concurrency and method, then τ and speedup per category."""
    lines = [f"{' trtspec bench ':=^{RULE}}",
             f"{'Target:':<28}{report['target']} ({report['mode']})",
             f"{'Prompts:':<28}{report['prompt_set']}" + (f" ({report['split']} split)" if report["split"] else "")
             + (" (spread across its categories)" if report.get("spread") else "") + f", {report['prompts']}",
             f"{'Max tokens, temperature:':<28}{report['max_tokens']}, {report['temperature']:g}",
             f"{'Load average before/after:':<28}{report['load_average']['before'][0]} / "
             f"{report['load_average']['after'][0]}",
             "-" * RULE,
             f"{'conc':>4} {'method':<10} {'req/s':>6} {'tok/s':>7} {'tok/s/u':>7} {'TTFT p50':>8} {'p99':>7} "
             f"{'TPOT p50':>8} {'p99':>6} {'ITL p50':>7} {'τ':>5} {'acc':>5} {'speedup':>7} {'same':>5}"]
    if "served" in report:  # serving mode: the in-process rows, then the served ones
        lines += ["in-process:", *_rows(report["results"]), "served:", *_rows(report["served"]["results"])]
    else:
        lines += _rows(report["results"])
    for c, level in report.get("serving", {}).items():
        if c == "target":
            continue
        for method, m in level["methods"].items():
            lines.append(f"served ÷ in-process, concurrency {c}, {method}: {m['served_tok_s']:.1f} ÷ "
                         f"{m['in_process_tok_s']:.1f} tok/s = {_x(m['ratio'])}"
                         + (f" (target ≥ {report['serving']['target']})" if c == "1" else "")
                         + f"; TTFT p50 {num(m['served_ttft_ms_p50'])} vs {num(m['in_process_ttft_ms_p50'])} ms"
                         + (f"; outputs identical {m['outputs_identical']}" if m["outputs_identical"] else ""))
        if b := level.get("engine_batching"):
            lines.append(f"engine batching at concurrency {c}: {b['steps']} steps, {b['sequences_per_step']} "
                         "sequences per step")
    lines += ["-" * RULE, f"{'conc':>4} {'method':<10} {'category':<16} {'τ':>5} {'speedup':>7}  per-position acceptance"]
    lines += [f"{concurrency:>4} {method:<10} {category:<16} {g['tau']:>5.2f} {_x(g['speedup']):>7}  "
              + " ".join(f"{x:.2f}" for x in g["per_position_acceptance"])
              for concurrency, methods in report["results"].items() for method, figures in methods.items()
              if method != PLAIN for category, g in figures["categories"].items()]
    lines += _open_loop_rows(report.get("open_loop"))
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines.append("=" * RULE)
    return lines


def _open_loop_rows(open_loop: dict | None) -> list[str]:
    """The open-loop levels: offered and achieved request rate, tokens/s, latency percentiles, goodput."""
    if not open_loop:
        return []
    slos = open_loop["slos_ms"]
    lines = ["-" * RULE, "open loop (Poisson arrivals)" + (": goodput counts requests within " + ", ".join(
        f"{k} {v:g} ms" for k, v in slos.items()) if slos else ""),
             f"{'rate':>5} {'method':<10} {'req/s':>6} {'tok/s':>7} {'TTFT p50':>8} {'p99':>7} {'TPOT p50':>8} "
             f"{'p99':>6} {'E2E p50':>8} {'p99':>8} {'τ':>5} {'speedup':>7} {'same':>5}"
             + (f" {'goodput':>8}" if slos else "")]
    return lines + [f"{rate:>5} {method:<10} {g['request_throughput']:>6.2f} {g['output_tokens_per_s']:>7.1f} "
                    f"{_ms(g['ttft_ms'], 'p50'):>8} {_ms(g['ttft_ms'], 'p99'):>7} "
                    f"{_ms(g['tpot_ms'], 'p50'):>8} {_ms(g['tpot_ms'], 'p99'):>6} "
                    f"{_ms(g['e2e_ms'], 'p50'):>8} {_ms(g['e2e_ms'], 'p99'):>8} {g['tau']:>5.2f} "
                    f"{_x(g['speedup']):>7} {g['identical'] or '-':>5}" + (f" {g['goodput']:>8.2f}" if slos else "")
                    for rate, methods in open_loop["results"].items() for method, g in methods.items()]


def _rows(results: dict) -> list[str]:
    lines = []
    for concurrency, methods in results.items():
        for method, figures in methods.items():
            g = figures["overall"]
            lines.append(f"{concurrency:>4} {method:<10} {g['request_throughput']:>6.2f} "
                         f"{g['output_tokens_per_s']:>7.1f} {g['tokens_per_s_per_user']:>7.1f} "
                         f"{_ms(g['ttft_ms'], 'p50'):>8} {_ms(g['ttft_ms'], 'p99'):>7} "
                         f"{_ms(g['tpot_ms'], 'p50'):>8} {_ms(g['tpot_ms'], 'p99'):>6} {_ms(g['itl_ms'], 'p50'):>7} "
                         f"{g['tau']:>5.2f} {g['acceptance_rate']:>5.2f} {_x(g['speedup']):>7} "
                         f"{g['identical'] or '-':>5}")
    return lines


def _ms(dist: dict | None, key: str) -> str:
    return "-" if dist is None else f"{dist[key]:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def write_outputs(run: BenchRun, out: Path) -> dict[str, Path]:
    """summary.json, requests.csv and the plots the run has levels for into `out`, each file atomically."""
    from trtspec.outdir import atomic_output_file

    out.mkdir(parents=True, exist_ok=True)
    written = {"summary": out / "summary.json", "requests": out / "requests.csv"}
    with atomic_output_file(written["summary"]) as tmp:
        tmp.write_text(json.dumps(run.report, indent=1) + "\n")
    with atomic_output_file(written["requests"]) as tmp, tmp.open("w", newline="") as f:
        write_csv(f, run.records, CSV_FIELDS)
    for name, (applies, draw) in PLOTS.items():
        if applies(run.report):
            with atomic_output_file(out / name) as tmp:
                draw(run.report, tmp)
            written[name] = out / name
    return written


def _figure(report: dict, columns: int):
    """A figure of `columns` panels titled with the target, the mode, the prompt set and n."""
    fig, axes = subplots(1, columns, figsize=(5.5 * columns, 4.3), squeeze=False)
    fig.suptitle(f"{report['target']} ({report['mode']}), {report['prompt_set']}, n = {report['prompts']} prompts, "
                 f"T = {report['temperature']:g}", fontsize=10)
    return fig, axes[0]


def _closed_loop(report: dict) -> bool:
    return bool(report["results"])


def plot_categories(report: dict, path: Path) -> None:
    """τ and speedup per category, one bar per method, at the lowest concurrency."""
    fig, (tau_ax, speed_ax) = _figure(report, 2)
    concurrency, methods = next(iter(report["results"].items()))
    drafters = [m for m in methods if m != PLAIN]
    categories = [*report["categories"], "overall"]
    width = 0.8 / max(1, len(drafters))
    for i, method in enumerate(drafters):
        groups = {**methods[method]["categories"], "overall": methods[method]["overall"]}
        xs = [j + i * width for j in range(len(categories))]
        tau_ax.bar(xs, [groups.get(c, {}).get("tau", 0) for c in categories], width, label=method)
        speed_ax.bar(xs, [groups.get(c, {}).get("speedup") or 0 for c in categories], width, label=method)
    for ax, title in ((tau_ax, "τ (tokens per verify step)"), (speed_ax, "speedup over plain decoding")):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=30, ha="right")
        ax.set_title(f"{title}, concurrency {concurrency}")
        ax.set_ylim(bottom=0)
        if drafters:
            ax.legend()
    speed_ax.axhline(1.0, color="grey", lw=0.8)
    save_figure(fig, path)


def plot_positions(report: dict, path: Path) -> None:
    """Per-position acceptance (P(depth d accepted | depth d − 1 was)) of each method, at the lowest concurrency."""
    from matplotlib.ticker import MaxNLocator

    fig, (ax,) = _figure(report, 1)
    concurrency, methods = next(iter(report["results"].items()))
    for method, figures in methods.items():
        if method != PLAIN and (rates := figures["overall"]["per_position_acceptance"]):
            ax.plot(range(1, len(rates) + 1), rates, marker="o", label=method)
    ax.set_xlabel("draft depth")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("acceptance given the parent's")
    ax.set_ylim(0, 1)
    ax.set_title(f"per-position acceptance, concurrency {concurrency}")
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    save_figure(fig, path)


def plot_concurrency(report: dict, path: Path) -> None:
    """Output tokens/s, the speedup over plain decoding, TPOT p50 and TTFT p50 against concurrency, one line per
    method: where speculation stops paying."""
    levels = [int(c) for c in report["results"]]
    rows = {method: [report["results"][str(c)].get(method, {}).get("overall") for c in levels]
            for method in report["methods"]}
    panels = (("output tokens/s", lambda g: g["output_tokens_per_s"]),
              ("speedup over plain decoding", lambda g: g["speedup"]),
              ("TPOT p50 (ms)", lambda g: (g["tpot_ms"] or {}).get("p50")),
              ("TTFT p50 (ms)", lambda g: (g["ttft_ms"] or {}).get("p50")))
    _plot_levels(report, path, levels, rows, "concurrency (closed-loop users)", log_x=len(levels) > 1,
                 panels=panels)


def plot_open_loop(report: dict, path: Path) -> None:
    """Output tokens/s, the speedup, TTFT p50 and end-to-end p99 (and goodput, given SLOs) against the request
    rate, one line per method."""
    results = report["open_loop"]["results"]
    levels = [float(r) for r in results]
    rows = {method: [results[r].get(method) for r in results] for method in report["methods"]}
    panels = [("output tokens/s", lambda g: g["output_tokens_per_s"]),
              ("speedup over plain decoding", lambda g: g["speedup"]),
              ("TTFT p50 (ms)", lambda g: (g["ttft_ms"] or {}).get("p50")),
              ("end-to-end p99 (ms)", lambda g: (g["e2e_ms"] or {}).get("p99"))]
    if report["open_loop"]["slos_ms"]:
        panels.append(("goodput (requests/s within the SLOs)", lambda g: g.get("goodput")))
    _plot_levels(report, path, levels, rows, "request rate (Poisson arrivals per second)", log_x=False,
                 panels=panels)


def _plot_levels(report: dict, path: Path, levels: list, rows: dict, xlabel: str, *, log_x: bool, panels) -> None:
    """One panel per (title, value of a level's figures), one line per method, ticks at the measured levels, every
    value axis from zero."""
    fig, axes = _figure(report, len(panels))
    for method, figures in rows.items():
        for ax, (title, value) in zip(axes, panels):
            if title.startswith("speedup") and method == PLAIN:
                continue
            ax.plot(levels, [value(g) if g else None for g in figures], marker="o", label=method)
    for ax, (title, _) in zip(axes, panels):
        ax.set_xlabel(xlabel)
        ax.set_title(title)
        if log_x:
            ax.set_xscale("log", base=2)
            ax.minorticks_off()
        else:
            ax.set_xlim(left=0)
        ax.set_xticks(levels, [f"{x:g}" for x in levels])
        ax.set_ylim(bottom=0)
        if title.startswith("speedup"):
            ax.axhline(1.0, color="grey", lw=0.8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    save_figure(fig, path)


PLOTS = {"categories.png": (_closed_loop, plot_categories), "acceptance.png": (_closed_loop, plot_positions),
         "concurrency.png": (_closed_loop, plot_concurrency),
         "open_loop.png": (lambda report: bool(report.get("open_loop")), plot_open_loop)}
