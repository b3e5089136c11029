"""The recipe gate: measure a recipe's baseline slice in one run and fail when a figure falls past its tolerance or
an output differs from plain decoding.

Speed on a shared CI machine is noisy, so the figures worth gating are the ratios measured in the same run (τ,
acceptance rate, speedup over plain decoding on the same engine, the two alternating prompt by prompt); absolute
tokens/s is gated only where a recipe gives it a tolerance.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trtspec.errors import ConfigError

# the figures a baseline may hold (bench.compare.speculation_cell's names)
FIGURES = ("tau", "acceptance_rate", "speedup", "decode_speedup", "tokens_per_s", "plain_tokens_per_s")
SHOWN = ("tau", "acceptance_rate", "speedup", "tokens_per_s")


@dataclass(frozen=True)
class Check:
    prompt_set: str
    figure: str
    baseline: float | None
    now: float | None
    tolerance: float | None  # None: reported, not gated

    @property
    def floor(self) -> float | None:
        if self.baseline is None or self.tolerance is None:
            return None
        return self.baseline * (1.0 - self.tolerance)

    @property
    def ok(self) -> bool:
        floor = self.floor
        return floor is None or (self.now is not None and self.now >= floor - 1e-12)


@dataclass
class GateResult:
    method: str
    checks: list[Check] = field(default_factory=list)
    identical: dict[str, str] = field(default_factory=dict)  # per set: "n/m" outputs equal to plain decoding
    measured: dict[str, dict] = field(default_factory=dict)  # per set: every figure measured
    problems: list[str] = field(default_factory=list)  # what failed, one line each
    load_average: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"method": self.method, "passed": self.passed, "problems": self.problems,
                "identical": self.identical, "load_average": self.load_average, "measured": self.measured,
                "checks": [asdict(c) | {"floor": c.floor, "ok": c.ok} for c in self.checks]}


def measure_slice(recipe, engine_dir: Path, show=print) -> tuple[dict, dict]:
    """Measure the baseline's slice (`trtspec bench` on the engine, the method alone): (per prompt set the method's
    figures, the whole report). The drafter's whole tree every step (no back-off, whose choices follow the drafter's
    measured time): τ then depends on the code and the baseline's verify curve only."""
    from trtspec.bench.compare import CompareOptions, run_compare

    b, bench = recipe.baseline, recipe.bench
    method = b.method or recipe.methods[0]
    datastore = bench.datastore if bench is not None else None
    costs = None
    if b.verify_curve is not None:  # the curve the baseline was measured with: τ then depends on the code only
        costs = {"profiles": list(b.verify_curve["profiles"]), "relative": list(b.verify_curve["relative"])}
    options = CompareOptions(engines=(engine_dir,), sets=tuple(b.prompt_sets), methods=(method,), own_drafter=False,
                             limit=b.limit, max_tokens=b.max_tokens,
                             threads=(bench.threads if bench is not None else None) or 2,
                             spin=bench.spin if bench is not None else None,
                             datastore=Path(datastore) if datastore else None, step_costs=costs, backoff=False,
                             work=Path(engine_dir).parent / "bench-work")
    try:
        report = run_compare(options, show=show, progress=False)
    except ConfigError as e:
        if costs is None or "verify curve" not in str(e):
            raise
        raise ConfigError(f"recipe baseline.verify_curve: {e}; delete it and run --gate --update-baseline to measure "
                          "the baseline again") from None
    (entry,) = report["systems"].values()
    return {name: entry["methods"][method][name] for name in report["sets"]}, report


def judge(baseline, method: str, measured: dict[str, dict], load_average: dict | None = None) -> GateResult:
    """Compare what was measured with the baseline: every toleranced figure at or above its floor, every output
    equal to plain decoding's, every baseline set measured."""
    result = GateResult(method=method, measured=measured, load_average=load_average or {})
    for name in baseline.prompt_sets:
        row = measured.get(name)
        if row is None:
            result.problems.append(f"{name}: no prompt measured (all longer than the engine's max input?)")
            continue
        same, total = row["identical"], row["compared"]
        result.identical[name] = f"{same}/{total}"
        if same != total:
            result.problems.append(f"{name}: {total - same} of {total} outputs differ from plain decoding (T = 0)")
        expected = baseline.figures.get(name, {})
        for figure in FIGURES:
            if figure not in expected and figure not in SHOWN:
                continue
            tolerance = baseline.tolerance.get(figure) if figure in expected else None
            check = Check(name, figure, expected.get(figure), row.get(figure), tolerance)
            result.checks.append(check)
            if not check.ok:
                result.problems.append(f"{name}: {figure} {check.now:g} fell below {check.floor:.4g} "
                                       f"(baseline {check.baseline:g} - {tolerance:.0%})")
    return result  # with no baseline figures yet, only identity and coverage are gated


def format_table(result: GateResult) -> str:
    lines = [f"gate: method {result.method}, load average {result.load_average}",
             f"{'set':<20} {'figure':<18} {'baseline':>9} {'now':>9} {'change':>8} {'floor':>9}  verdict"]
    for c in result.checks:
        change = f"{c.now / c.baseline - 1:+.1%}" if c.baseline and c.now is not None else "-"
        verdict = "ok" if c.ok else "FAIL"
        if c.tolerance is None:
            verdict = "(not gated)" if c.baseline is not None else "(no baseline)"
        lines.append(f"{c.prompt_set:<20} {c.figure:<18} {_num(c.baseline):>9} {_num(c.now):>9} {change:>8} "
                     f"{_num(c.floor):>9}  {verdict}")
    for name, same in result.identical.items():
        lines.append(f"{name:<20} {'identical outputs':<18} {'':>9} {same:>9} {'':>8} {'all':>9}  "
                     f"{'ok' if same.split('/')[0] == same.split('/')[1] else 'FAIL'}")
    lines.append("gate passed" if result.passed else "gate FAILED: " + "; ".join(result.problems))
    return "\n".join(lines)


def _num(value) -> str:
    return "-" if value is None else f"{value:.4g}"


def write_report(result: GateResult, folder: Path) -> list[Path]:
    """gate.json and gate.png (τ and speedup per prompt set, baseline vs now) into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "gate.json"
    report.write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return [report, *_plot(result, folder / "gate.png")]


def _plot(result: GateResult, png: Path) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are optional on a client-only install
        return []
    figures = [f for f in ("tau", "speedup") if any(c.figure == f for c in result.checks)]
    if not figures:
        return []
    fig, axes = plt.subplots(1, len(figures), figsize=(5 * len(figures), 3.6), squeeze=False)
    for ax, figure in zip(axes[0], figures):
        checks = [c for c in result.checks if c.figure == figure]
        xs = range(len(checks))
        ax.bar([x - 0.2 for x in xs], [c.baseline or 0 for c in checks], 0.4, label="baseline", color="#9aa5b1")
        ax.bar([x + 0.2 for x in xs], [c.now or 0 for c in checks], 0.4, label="now",
               color=["#2f855a" if c.ok else "#c53030" for c in checks])
        for x, c in zip(xs, checks):
            if c.floor is not None:
                ax.hlines(c.floor, x - 0.4, x + 0.4, colors="black", linestyles="dotted")
        ax.set_xticks(list(xs), [c.prompt_set for c in checks], rotation=15)
        ax.set_title({"tau": "τ (tokens per verify step)", "speedup": "speedup over plain"}[figure])
        ax.legend(fontsize=8)
    fig.suptitle(f"recipe gate, method {result.method}: {'passed' if result.passed else 'FAILED'}")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)
    return [png]


def update_baseline(recipe_file: Path, method: str, measured: dict[str, dict], defaults: dict,
                    verify_curve: dict | None = None) -> None:
    """Write the measured figures (and the verify curve the drafters budgeted against, when given) into the recipe's
    baseline, keeping the file's comments and key order (a baseline block is added from `defaults` when the recipe
    has none). Atomic: temp file + rename."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    from trtspec.outdir import atomic_output_file

    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        data = yaml.load(Path(recipe_file).read_text())
    except Exception as e:  # ruamel raises its own error family
        raise ConfigError(f"{recipe_file}: unreadable recipe ({e})") from None
    baseline = data.get("baseline")
    if baseline is None:
        baseline = CommentedMap(defaults)
        data["baseline"] = baseline
    baseline.setdefault("method", method)
    if verify_curve is not None:
        from ruamel.yaml.comments import CommentedSeq

        curve = CommentedMap()
        for key in ("profiles", "relative"):
            curve[key] = CommentedSeq(verify_curve[key])
            curve[key].fa.set_flow_style()
        baseline["verify_curve"] = curve
    figures = baseline.get("figures")
    if figures is None:
        figures = baseline["figures"] = CommentedMap()
    for name, row in measured.items():
        entry = figures.get(name)
        if entry is None:
            entry = figures[name] = CommentedMap()
        for figure in FIGURES:
            if figure in row:
                entry[figure] = round(float(row[figure]), 3)
    with atomic_output_file(Path(recipe_file)) as tmp, open(tmp, "w") as f:
        yaml.dump(data, f)
