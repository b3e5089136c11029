"""OpenVINO GenAI as a peer of `trtspec bench`. Without OpenVINO: the options, the targets from synthetic reports
(benchmarks/peer_targets.py), the pairing of its prompt lookup with its plain decoding, the IR's weight bytes and the
one-line hints when it is not installed. With it (`PEERS=openvino bash scripts/setup-peers.sh`; CI does not run that,
as for llama.cpp): a tiny random LLaMA exported by optimum-intel and decoded in child processes as the benches run
it, its greedy tokens from ids equal to transformers', its prompt lookup's equal to its own greedy's, and a `trtspec
bench` run that matches it to int8 / int4 engines. No speed is asserted."""

from __future__ import annotations

import shutil
import sys

import pytest
from click.testing import CliRunner

from benchmarks.floors import openvino_weight_bytes
from benchmarks.peer_targets import render, run_targets, targets
from trtspec.bench import compare, peers
from trtspec.bench.compare import CompareOptions, System, peer_systems, render_table, summarize
from trtspec.bench.peers import (OPENVINO_EXPORTER, OPENVINO_INSTALL, OPENVINO_MODULES, build_openvino_model,
                                 missing_modules, run_child)
from trtspec.cli import cli
from trtspec.errors import ConfigError

OPENVINO_MISSING = missing_modules(OPENVINO_MODULES)
HINT = f"openvino_genai not installed ({OPENVINO_INSTALL})"


def without_openvino(mp: pytest.MonkeyPatch) -> str:
    """Block `import openvino_genai` here (a None entry in sys.modules), as if OpenVINO GenAI were not installed;
    return the hint the benches give (naming every OpenVINO module missing: all three where none is installed)."""
    mp.setitem(sys.modules, "openvino_genai", None)
    missing = missing_modules(OPENVINO_MODULES)
    assert "openvino_genai" in missing
    return f"{', '.join(missing)} not installed ({OPENVINO_INSTALL})"


# ---- options and hints --------------------------------------------------------------------------------------

def test_options_check_openvino_lookup(tmp_path):
    options = CompareOptions(engines=(tmp_path,), hf=tmp_path, peers=("openvino",))
    assert options.openvino_lookup == (3, 5)  # max_ngram_size, num_assistant_tokens: openvino.genai's sample
    with pytest.raises(ConfigError, match="--peers openvino: needs --hf DIR"):
        CompareOptions(engines=(tmp_path,), peers=("openvino",))
    with pytest.raises(ConfigError, match=r"--openvino-lookup 3,0: give N,K \(max_ngram_size, num_assistant_tokens\)"):
        CompareOptions(engines=(tmp_path,), peers=(), openvino_lookup=(3, 0))


def test_command_parses_openvino_lookup(tmp_path):
    result = CliRunner().invoke(cli, ["bench", str(tmp_path), "--sets", "mt-bench", "--openvino-lookup", "3"])
    assert result.exit_code == 2 and "expected two integers N,K, got '3'" in result.output
    result = CliRunner().invoke(cli, ["bench", str(tmp_path), "--sets", "mt-bench", "--openvino-lookup", "3,0"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1].startswith("error: --openvino-lookup 3,0: give N,K")


def test_peer_not_installed_is_skipped_with_the_setup_command(tmp_path, monkeypatch):
    hint = without_openvino(monkeypatch)
    assert hint.endswith("(PEERS=openvino bash scripts/setup-peers.sh installs OpenVINO GenAI and its exporter)")
    lines = []
    options = CompareOptions(engines=(tmp_path,), peers=("openvino",), hf=tmp_path)
    systems, skipped = peer_systems(options, tmp_path, lines.append, formats=("int8", "int4"))
    assert systems == [] and skipped == {"openvino": hint}
    assert lines == [f"openvino: skipped, {hint}"]


def test_peers_need_an_engine_format_to_match(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "missing_modules", lambda modules: [])
    lines = []
    options = CompareOptions(engines=(tmp_path,), peers=("transformers", "llama.cpp"), hf=tmp_path)
    systems, skipped = peer_systems(options, tmp_path, lines.append, formats=("int8",))
    assert systems == [] and skipped == {"transformers": "no fp32 engine among ENGINES to match",
                                         "llama.cpp": "no int4 engine among ENGINES to match"}


def test_export_needs_the_exporter_and_reuses_a_finished_one(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "OPENVINO_EXPORTER", tmp_path / "absent" / "optimum-cli")
    with pytest.raises(ConfigError, match=r"OpenVINO's exporter is not installed .*: run `PEERS=openvino bash "
                                          r"scripts/setup-peers.sh"):
        build_openvino_model(tmp_path, tmp_path / "ov", log=tmp_path / "log", weights="int4")
    with pytest.raises(ConfigError, match="OpenVINO weight format int3: choose from fp32, int8, int4"):
        build_openvino_model(tmp_path, tmp_path / "ov", log=tmp_path / "log", weights="int3")
    (tmp_path / "done").mkdir()
    (tmp_path / "done" / "openvino_model.xml").write_text("<net/>")
    assert build_openvino_model(tmp_path, tmp_path / "done", log=tmp_path / "log", weights="int4") == tmp_path / "done"


# ---- weight bytes of an IR ----------------------------------------------------------------------------------

def _ir(tmp_path, tied: bool):
    """A hand-written IR: an int4 embedding table (decompressed: Convert, Multiply by its scale) gathered from, and an
    lm_head matrix through its own decompression into a MatMul; tied: the lm_head's constant is the table's bytes."""
    head = (0, 100) if tied else (110, 200)
    layers = [(0, "Parameter", None), (1, "Const", (0, 100)), (2, "Const", (100, 10)), (3, "Convert", None),
              (4, "Multiply", None), (5, "Gather", None), (6, "Const", head), (7, "Convert", None),
              (8, "MatMul", None), (9, "Const", (310, 8))]
    edges = [(1, 3, 0), (3, 4, 0), (2, 4, 1), (4, 5, 0), (0, 5, 1), (9, 5, 2), (6, 7, 0), (5, 8, 0), (7, 8, 1)]
    xml = ['<?xml version="1.0"?><net name="m" version="11"><layers>']
    for i, kind, region in layers:
        data = f'<data element_type="u4" offset="{region[0]}" size="{region[1]}"/>' if region else ""
        ports = "".join(f'<port id="{port}"/>' for port in sorted(p for _, t, p in edges if t == i))
        xml.append(f'<layer id="{i}" name="n{i}" type="{kind}" version="opset1">{data}'
                   + (f"<input>{ports}</input>" if ports else "") + '<output><port id="9"/></output></layer>')
    xml.append("</layers><edges>")
    xml += [f'<edge from-layer="{f}" from-port="9" to-layer="{t}" to-port="{p}"/>' for f, t, p in edges]
    xml.append("</edges></net>")
    path = tmp_path / f"tied-{tied}.xml"
    path.write_text("".join(xml))
    return path


def test_ir_weight_bytes_leave_an_untied_table_out(tmp_path):
    # untied: the table and its scales are only gathered from; the lm_head and the axis constant are read
    assert openvino_weight_bytes(_ir(tmp_path, tied=False)) == {"read": 200 + 8, "gathered": 100 + 10}
    # tied: the table's bytes are the lm_head's, read whole every step (its scales still only gathered from here)
    assert openvino_weight_bytes(_ir(tmp_path, tied=True)) == {"read": 100 + 8, "gathered": 10}


# ---- summary and targets ------------------------------------------------------------------------------------

def _run(out: list[int], total: float, steps: int | None = None) -> dict:
    return {"output_ids": out, "ttft_s": 0.1, "total_s": total, **({} if steps is None else {"steps": steps})}


def _openvino_summary() -> dict:
    """Two prompts of one set through OpenVINO at int8 and int4, plain and with prompt lookup (int4's lookup differs
    from its plain decoding on the second prompt)."""
    prompts = [{"set": "code-edit", "id": "a", "ids": [1]}, {"set": "code-edit", "id": "b", "ids": [2]}]
    systems = [System(f"OpenVINO GenAI {d}", "openvino", "f", {}, d, ("lookup",), d) for d in ("int8", "int4")]

    def row(prompt, plain, lookup):
        return {"prompt": prompt, "round": 0, "runs": {"none": plain, "lookup": lookup}}

    samples = {"OpenVINO GenAI int8": [row(0, _run([1, 2, 3], 1.0), _run([1, 2, 3], 0.5, 1)),
                                       row(1, _run([4, 5], 1.0), _run([4, 5], 0.5, 1))],
               "OpenVINO GenAI int4": [row(0, _run([1, 2, 3, 4, 5], 1.1), _run([1, 2, 3, 4, 5], 0.6, 2)),
                                       row(1, _run([7, 8, 9], 0.5), _run([7, 8, 0], 0.3, 2))]}
    return summarize(systems, samples, prompts, {})


def test_each_lookup_is_compared_with_plain_decoding_at_its_format():
    report = _openvino_summary()
    int4 = report["systems"]["OpenVINO GenAI int4"]
    assert int4["matches"] == "int4" and list(int4["methods"]) == ["lookup"]
    cell = int4["methods"]["lookup"]["all"]
    assert (cell["identical"], cell["compared"]) == (1, 2)
    assert cell["tau"] == pytest.approx((4 + 2) / 4)  # 6 tokens after the first in 4 decode steps
    assert report["systems"]["OpenVINO GenAI int8"]["methods"]["lookup"]["all"]["identical"] == 2


def _report_against_openvino() -> dict:
    """Engines int8 and int4 beside OpenVINO at both formats, on two sets, rates end to end."""
    def plain(rate: float) -> dict:
        return {s: {"tokens_per_s": rate, "decode_tokens_per_s": rate} for s in ("all", "code-edit", "mt-bench")}

    def cells(rate: float, identical: int, compared: int = 2) -> dict:
        return {s: {"tokens_per_s": rate, "decode_tokens_per_s": rate, "identical": identical, "compared": compared}
                for s in ("all", "code-edit", "mt-bench")}


    systems = {
        "int8": {"kind": "engine", "format": "int8 b32", "plain": plain(130.0),
                 "methods": {"ngram": cells(150.0, 2), "suffix": cells(400.0, 1)}},  # suffix: not lossless here
        "int4": {"kind": "engine", "format": "int4 b32", "plain": plain(100.0), "methods": {"ngram": cells(200.0, 2)}},
        "OpenVINO GenAI int8": {"kind": "openvino", "format": "", "matches": "int8", "plain": plain(100.0),
                                "methods": {"lookup": cells(125.0, 2)}},
        "OpenVINO GenAI int4": {"kind": "openvino", "format": "", "matches": "int4", "plain": plain(100.0),
                                "methods": {"lookup": cells(190.0, 1)}},
    }
    return {"systems": systems, "sets": ["code-edit", "mt-bench"]}


def test_targets_against_openvino_at_each_format_and_set():
    result = {t["name"]: t for t in targets(_report_against_openvino(), {}, ("openvino",)) if "OpenVINO" in t["name"]}
    assert len(result) == 2 * 2 * 2  # engines x sets x (plain, speculation)
    plain8 = result["int8 plain ÷ OpenVINO GenAI int8 plain on code-edit"]
    assert (plain8["value"], plain8["at_least"], plain8["ok"]) == (1.3, 1.2, True)
    assert result["int4 plain ÷ OpenVINO GenAI int4 plain on mt-bench"]["ok"] is False  # 1.0x < 1.2x
    # int8's best lossless drafter is ngram (suffix is faster but its outputs differ from plain decoding)
    spec8 = result["int8 + ngram ÷ OpenVINO GenAI int8 + prompt lookup on code-edit"]
    assert (spec8["value"], spec8["at_least"], spec8["ok"], spec8["note"]) == (1.2, 1.1, True, None)
    spec4 = result["int4 + ngram ÷ OpenVINO GenAI int4 + prompt lookup on mt-bench"]
    assert spec4["ok"] is False and spec4["value"] == pytest.approx(200 / 190, abs=1e-3)
    assert spec4["note"] == "its outputs identical to its own greedy decoding on 1/2 only"


def test_openvino_targets_not_measured_say_why():
    report = _report_against_openvino()
    for label in [label for label in report["systems"] if "OpenVINO" in label]:
        del report["systems"][label]
    skipped = {"openvino": HINT}
    lines = [t for t in targets(report, skipped) if "OpenVINO" in t["name"]]
    assert len(lines) == 8 and all(t["ok"] is None for t in lines)
    assert {t["reason"] for t in lines} == {HINT}
    report = _report_against_openvino()
    report["systems"]["int4"]["methods"]["ngram"]["code-edit"]["identical"] = 1
    spec = {t["name"]: t for t in targets(report, {})}["int4 + speculation ÷ OpenVINO GenAI int4 + prompt lookup on "
                                                       "code-edit"]
    assert spec["ok"] is None
    assert spec["reason"] == "no drafter's outputs all token-identical to plain decoding on code-edit"


def test_table_shows_a_lookup_that_differs_from_its_own_greedy():
    report = _openvino_summary()
    report.update(skipped={}, load_average={"before": [0, 0, 0], "after": [0, 0, 0]},
                  settings={"prompts": 2, "limit": 2, "max_tokens": 8, "threads": 1, "rounds": 1, "cpus": 2})
    text = render_table(report)
    int4 = [line for line in text if line.startswith("OpenVINO GenAI int4") and "lookup" in line]
    assert any("code-edit" in line and " 1/2" in line for line in int4)  # the "same" column
    text = render(targets(_report_against_openvino(), {}, ("openvino",)))
    assert "its outputs identical to its own greedy decoding on 1/2 only" in "\n".join(text)  # beside its target


# ---- with OpenVINO installed: a tiny random LLaMA ---------------------------------------------------------------

needs_openvino = pytest.mark.skipif(bool(OPENVINO_MISSING) or not OPENVINO_EXPORTER.is_file(),
                                    reason="OpenVINO GenAI or its exporter is not installed: run `PEERS=openvino bash "
                                           "scripts/setup-peers.sh`")
PROMPTS = [[1, 5, 9, 13, 5, 9, 13, 5, 9], [2, 4, 8, 16, 32, 3, 7, 2, 4, 8], [7, 7, 30, 31, 32, 33, 30, 31]]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random LLaMA (untied embeddings: its greedy tokens vary, where a tied one repeats its last token) with a
    tiny BPE tokenizer in its HF folder (the exporter converts it too), its int8 and int4 CPU engines, and its fp32,
    int8 and int4 OpenVINO exports."""
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("openvino")
    vocab = write_tiny_tokenizer(root / "tok")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab, max_position_embeddings=4096), drafters=("none",))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / "tok" / name, root / "base" / name)
    out = {"root": root, "hf": root / "base", "work": root / "work"}
    out["work"].mkdir()
    for weights in ("int8", "int4"):
        out[weights] = root / weights
        build(BuildOptions(source=ckpt["none"], out=out[weights], max_input_len=2048, max_seq_len=2304,
                           max_draft_len=4, weights=weights, tokenizer=root / "tok"))
    for weights in ("fp32", "int8", "int4"):  # the names `trtspec bench` gives them, so that its run reuses these
        out[f"openvino-{weights}"] = build_openvino_model(out["hf"], out["work"] / f"openvino-{weights}",
                                                          log=out["work"] / f"openvino-{weights}-export.log",
                                                          weights=weights)
    return out


def _decode(tiny, function: str, model: str, **extra) -> list[dict]:
    kwargs = {"model": str(tiny[model]), "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "threads": 1, **extra}
    return run_child(f"trtspec.bench.peers:{function}", kwargs, log=tiny["root"] / "children.log", threads=1)


@pytest.mark.slow
@needs_openvino
def test_greedy_from_ids_is_transformers_greedy(tiny):
    """fp32 IR fed the prompts' ids: no chat template and no BOS added, so its greedy tokens are transformers'."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tiny["hf"], dtype=torch.float32).eval()
    expected = []
    for ids in PROMPTS:
        x = torch.tensor([ids])
        with torch.inference_mode():
            out = loaded.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=MAX_TOKENS,
                                  do_sample=False, pad_token_id=0)
        expected.append(out[0, len(ids):].tolist())
    rows = _decode(tiny, "run_openvino", "openvino-fp32")
    assert [r["runs"]["none"]["output_ids"] for r in rows] == expected
    assert len({t for out in expected for t in out}) > 3  # tokens that vary: the comparison means something


@pytest.mark.slow
@needs_openvino
@pytest.mark.parametrize("weights", ["int8", "int4"])
def test_rows_and_prompt_lookup_runs(tiny, weights):
    rows = _decode(tiny, "run_openvino", f"openvino-{weights}", lookup=[3, 5])
    assert [r["prompt"] for r in rows] == list(range(len(PROMPTS)))
    assert [list(r["runs"]) for r in rows] == [["none", "lookup"], ["lookup", "none"], ["none", "lookup"]]
    plain, lookup = [r["runs"]["none"] for r in rows], [r["runs"]["lookup"] for r in rows]
    assert [sorted(p) for p in plain] == [["output_ids", "total_s", "ttft_s"]] * len(PROMPTS)
    for p, s in zip(plain, lookup):
        assert 0 < len(p["output_ids"]) <= MAX_TOKENS and 0 < p["ttft_s"] < p["total_s"]
        # OpenVINO's prompt lookup need not keep its own greedy tokens (on some CPUs its multi-token steps round
        # differently): the bench reports how many do, so here only that it decoded
        assert 0 < len(s["output_ids"]) <= MAX_TOKENS
        assert 0 <= s["steps"] <= len(s["output_ids"]) - 1
    # a step yields its accepted tokens and one more: fewer steps than tokens where the repeated n-grams are drafted
    assert sum(s["steps"] for s in lookup) < sum(len(s["output_ids"]) - 1 for s in lookup)


@pytest.mark.slow
@needs_openvino
def test_export_is_reused(tiny, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("exported again")

    monkeypatch.setattr(peers.subprocess, "run", refuse)
    done = tiny["openvino-int4"]
    assert build_openvino_model(tiny["hf"], done, log=tiny["root"] / "again.log", weights="int4") == done
    int4, int8 = (openvino_weight_bytes(tiny[f"openvino-{w}"] / "openvino_model.xml") for w in ("int4", "int8"))
    fp32 = openvino_weight_bytes(tiny["openvino-fp32"] / "openvino_model.xml")
    assert 0 < int4["read"] < int8["read"] < fp32["read"]
    assert fp32["gathered"] > 0  # the untied embedding table


@pytest.mark.slow
@needs_openvino
def test_bench_matches_openvino_to_each_engine_format(tiny):
    lines = []
    options = CompareOptions(engines=(tiny["int8"], tiny["int4"]), peers=("openvino",), hf=tiny["hf"],
                             sets=("mt-bench", "mt-bench-2turn"), limit=1, max_tokens=8, threads=1, work=tiny["work"])
    report = compare.run_compare(options, show=lines.append, progress=False)
    systems = report["systems"]
    for weights in ("int8", "int4"):
        ov = systems[f"OpenVINO GenAI {weights}"]
        assert ov["matches"] == weights and ov["format"] == compare.FORMAT_LABELS["openvino"][weights]
        assert ov["plain"]["all"]["runs"] == 2 and ov["plain"]["all"]["tokens_per_s"] > 0
        assert ov["methods"]["lookup"]["all"]["compared"] == 2
    ours = [t for t in run_targets(report) if "OpenVINO" in t["name"]]
    assert len(ours) == 2 * 2 * 2  # engines x sets x (plain, speculation)
    assert all(t["ok"] is not None for t in ours if " plain ÷ " in t["name"])
    for t in ours:
        assert t["ok"] is not None or t["reason"].startswith("no drafter's outputs all token-identical"), t
    text = "\n".join(render_table(report))
    assert "OpenVINO GenAI int4" in text and "mt-bench-2turn" in text
