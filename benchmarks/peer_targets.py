"""The targets set for trtspec's quantized engines against the CPU peers, read from a compare run of `trtspec bench
ENGINE... --peers ... --out DIR` (DIR/summary.json): each a PASS / FAIL line, or "not measured" with the reason.

    .venv/bin/python benchmarks/peer_targets.py DIR/summary.json [--json]

Every int4 engine against onnxruntime-genai int4 and llama.cpp on decode rates (after the first token): its plain
decoding, and on the grounded sets its fastest lossless drafter; every int8 and int4 engine against OpenVINO GenAI at
its format on every set, end to end: its plain decoding, and its best lossless drafter against OpenVINO's lookup.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.bench.compare import GENAI, LLAMA_CPP, OPENVINO
from trtspec.bench.peers import LOOKUP

GROUNDED_SETS = ("sharegpt-grounded", "code-edit")
# the targets set for quantized engines: a ratio each must reach
TARGET_PLAIN = 1.0  # int4 plain ÷ onnxruntime-genai int4 plain (decode rates)
TARGET_SPEC_GENAI = 1.5  # int4 + speculation ÷ onnxruntime-genai int4 plain, grounded sets
TARGET_SPEC_LLAMA = 2.0  # int4 + speculation ÷ llama.cpp plain, grounded sets
TARGET_OPENVINO_PLAIN = 1.2  # engine plain ÷ OpenVINO plain at its format, every set, end to end
TARGET_OPENVINO_SPEC = 1.1  # engine + its best lossless drafter ÷ OpenVINO + prompt lookup, every set, end to end
# the rates the targets compare: against onnxruntime-genai and llama.cpp, decoding after the first token (the prompt's
# prefill is TTFT, not decoding speed); against OpenVINO GenAI, end to end
TARGET_RATE = "decode_tokens_per_s"
TARGET_OPENVINO_RATE = "tokens_per_s"


def _line(out: list, name: str, value: float | None, at_least: float | None, reason: str | None = None,
          note: str | None = None) -> None:
    out.append({"name": name, "value": None if value is None else round(value, 3), "at_least": at_least,
                "ok": None if value is None else value >= at_least, "reason": reason, "note": note})


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours and theirs else None


def _peer(systems: dict, kind: str, dtype: str) -> str | None:
    return next((label for label, e in systems.items() if e["kind"] == kind and e.get("matches") == dtype), None)


def targets(report: dict, skipped: dict, peers: tuple[str, ...] = ()) -> list[dict]:
    """The quantized engines' targets, each pass / fail, or not measured with the reason: every int4 engine against
    onnxruntime-genai int4 and llama.cpp, then every int8 and int4 engine against OpenVINO GenAI at its format."""
    return int4_targets(report, skipped, peers) + openvino_targets(report, skipped, peers)


def _missing(peer: str, skipped: dict, peers: tuple[str, ...]) -> str:
    return skipped.get(peer) or (f"--peers without {peer}" if peer not in peers else f"no {peer} result")


def int4_targets(report: dict, skipped: dict, peers: tuple[str, ...] = ()) -> list[dict]:
    """Every int4 engine against onnxruntime-genai int4 and llama.cpp (decoding rates): plain ÷ genai plain, and on
    the grounded sets its fastest drafter ÷ each peer's plain."""
    systems, out = report["systems"], []
    int4 = [label for label, e in systems.items() if e["kind"] == "engine" and e["format"].startswith("int4")]
    if not int4:
        return []
    grounded = [s for s in report["sets"] if s in GROUNDED_SETS]
    genai, llama = _peer(systems, GENAI, "int4"), _peer(systems, LLAMA_CPP, "int4")
    for label in int4:
        engine = systems[label]
        name = f"{label} plain ÷ onnxruntime-genai int4 plain"
        theirs = genai and systems[genai]["plain"]["all"][TARGET_RATE]
        _line(out, name, _ratio(engine["plain"]["all"][TARGET_RATE], theirs), TARGET_PLAIN,
              None if genai else _missing(GENAI, skipped, peers))
        if not grounded:
            _line(out, f"{label} + speculation on grounded sets", None, TARGET_SPEC_GENAI, "no grounded set in --sets")
        for s in grounded:
            method, best = best_lossless(engine, s, TARGET_RATE)
            for peer, system, at_least in ((GENAI, genai, TARGET_SPEC_GENAI), (LLAMA_CPP, llama, TARGET_SPEC_LLAMA)):
                name = f"{label} + {method or 'speculation'} ÷ {system or peer} plain on {s}"
                if best is None:
                    _line(out, name, None, at_least, "no drafter measured" if not engine["methods"] else
                          f"no drafter's outputs all token-identical to plain decoding on {s}")
                elif system is None:
                    _line(out, name, None, at_least, _missing(peer, skipped, peers))
                else:
                    _line(out, name, _ratio(best, systems[system]["plain"][s][TARGET_RATE]), at_least)
    return out


def openvino_targets(report: dict, skipped: dict, peers: tuple[str, ...] = ()) -> list[dict]:
    """Every int8 and int4 engine against OpenVINO GenAI at the same format, on every set, end to end: plain ÷ its
    plain decoding, and the engine's best lossless drafter ÷ its prompt lookup (noting where that lookup's outputs
    were not all identical to its own greedy decoding's)."""
    systems, out, rate = report["systems"], [], TARGET_OPENVINO_RATE
    for label, engine in systems.items():
        dtype = engine["format"].split()[0] if engine["kind"] == "engine" else None
        if dtype not in ("int8", "int4"):
            continue
        peer = _peer(systems, OPENVINO, dtype)
        theirs = f"OpenVINO GenAI {dtype}"
        for s in report["sets"]:
            if peer is None:
                reason = _missing(OPENVINO, skipped, peers)
                _line(out, f"{label} plain ÷ {theirs} plain on {s}", None, TARGET_OPENVINO_PLAIN, reason)
                _line(out, f"{label} + speculation ÷ {theirs} + prompt lookup on {s}", None, TARGET_OPENVINO_SPEC,
                      reason)
                continue
            ov = systems[peer]
            _line(out, f"{label} plain ÷ {theirs} plain on {s}",
                  _ratio(engine["plain"][s][rate], ov["plain"][s][rate]), TARGET_OPENVINO_PLAIN)
            method, best = best_lossless(engine, s)
            name = f"{label} + {method or 'speculation'} ÷ {theirs} + prompt lookup on {s}"
            if method is None:
                _line(out, name, None, TARGET_OPENVINO_SPEC, "no drafter measured" if not engine["methods"] else
                      f"no drafter's outputs all token-identical to plain decoding on {s}")
            else:
                lookup = ov["methods"][LOOKUP][s]
                _line(out, name, _ratio(best, lookup[rate]), TARGET_OPENVINO_SPEC, note=identity_note(lookup))
    return out


def best_lossless(engine: dict, set_name: str, rate: str = TARGET_OPENVINO_RATE) -> tuple[str | None, float | None]:
    """The engine's fastest drafter (at `rate`) among those whose outputs on the set were all token-identical to its
    plain decoding: (method, rate), or (None, None)."""
    lossless = [(m, cells[set_name][rate]) for m, cells in engine["methods"].items()
                if cells[set_name]["compared"] and cells[set_name]["identical"] == cells[set_name]["compared"]
                and cells[set_name][rate]]
    return max(lossless, key=lambda x: x[1], default=(None, None))


def identity_note(cell: dict) -> str | None:
    """None where a speculation's outputs were all identical to its system's plain decoding, else how many were."""
    if cell["identical"] == cell["compared"]:
        return None
    return f"its outputs identical to its own greedy decoding on {cell['identical']}/{cell['compared']} only"


def run_targets(report: dict) -> list[dict]:
    """`targets` of a run's summary.json, each noting where the peers decoded fewer prompts than the engines."""
    settings = report["settings"]
    out = targets(report, report["skipped"], tuple(settings["peers"]))
    if settings["peer_limit"] is not None and settings["peer_limit"] < settings["limit"]:
        for t in out:
            t["note"] = "; ".join(filter(None, [t["note"], f"the peers decoded each set's first "
                                                           f"{settings['peer_limit']} prompts, the engines "
                                                           f"{settings['limit']}"]))
    return out


def render(targets: list[dict]) -> list[str]:
    lines = ["targets (against onnxruntime-genai and llama.cpp: decode tok/s, after the first token; against OpenVINO "
             "GenAI: tok/s end to end)"]
    for t in targets:
        verdict = {True: "PASS", False: "FAIL", None: "not measured"}[t["ok"]]
        value = "" if t["value"] is None else f" {t['value']:.2f}×"
        bound = "" if t["at_least"] is None else f" (target ≥ {t['at_least']:.1f}×)"
        reason = f": {t['reason']}" if t["reason"] else ""
        note = f" ({t['note']})" if t.get("note") else ""
        lines.append(f"  {verdict:<13}{t['name']}{value}{bound}{reason}{note}")
    return lines


@click.command()
@click.argument("summary", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print the targets as JSON.")
def main(summary: Path, as_json: bool) -> None:
    """The quantized engines' targets against the peers of a `trtspec bench --peers` run (its summary.json)."""
    report = json.loads(summary.read_text())
    if "systems" not in report or "settings" not in report:
        sys.exit(f"error: {summary} is not the summary.json of a compare run of `trtspec bench`")
    out = run_targets(report)
    click.echo(json.dumps(out, indent=2) if as_json else "\n".join(render(out)))


if __name__ == "__main__":
    main()
