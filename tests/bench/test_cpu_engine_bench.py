"""The CPU engine benchmark's pieces on a tiny model: engines per K, the verify curve, the bandwidth probe, the
decode runners and their child processes, the summary arithmetic and the command line. No speed is asserted."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks import cpu_engine
from benchmarks.cpu_engine import main as cli_main
from benchmarks.cpu_engine import (CpuBenchOptions, build_engines, identical_outputs, render_table, run_trtspec,
                                      summarize, verify_curve)
from benchmarks.floors import read_bandwidth
from trtspec.bench import peers
from trtspec.bench.peers import run_child
from trtspec.engine.manifest import ONNX_GRAPH_FORMAT, read_manifest
from trtspec.errors import ConfigError
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing import TinyModel, write_hf_base

# vocab ≠ hidden size: onnxruntime-genai 0.18's builder takes every Linear with vocab_size outputs for the LM head
MODEL = TinyModel(vocab_size=96)
KS = (0, 1, 3)
PROMPTS = [[1, 5, 9, 13], [2, 4, 8, 16, 32, 3, 7], [11]]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench")
    base = write_hf_base(root / "base", MODEL)
    engines = build_engines(base, root / "work", ks=KS, max_input_len=32, max_seq_len=64, show_progress=False)
    return base, engines


def test_build_engines_one_per_k_and_reuses_them(tiny, tmp_path):
    base, engines = tiny
    assert sorted(engines) == list(KS)
    assert [read_manifest(engines[k]).profile.tokens_per_step for k in KS] == [1, 2, 4]
    assert [read_manifest(engines[k]).method.value for k in KS] == ["none", "medusa", "medusa"]
    stamps = {k: (e / "manifest.json").stat().st_mtime_ns for k, e in engines.items()}
    again = build_engines(base, engines[0].parent, ks=KS, max_input_len=32, max_seq_len=64, show_progress=False)
    assert {k: (e / "manifest.json").stat().st_mtime_ns for k, e in again.items()} == stamps


def test_engine_of_an_older_graph_format_is_rebuilt(tiny):
    base, engines = tiny
    manifest = json.loads((engines[1] / "manifest.json").read_text())
    (engines[1] / "manifest.json").write_text(json.dumps({**manifest, "graph_format": 1}))
    build_engines(base, engines[0].parent, ks=(1,), max_input_len=32, max_seq_len=64, show_progress=False)
    assert read_manifest(engines[1]).graph_format == ONNX_GRAPH_FORMAT


def test_verify_curve_one_positive_ratio_per_k(tiny):
    curve = verify_curve({str(k): str(e) for k, e in tiny[1].items()}, past=8, repeats=2, warmup=1, threads=1)
    assert [(p["k"], p["slots"]) for p in curve] == [(0, 1), (1, 2), (3, 4)]
    assert curve[0]["ratio"] == 1.0
    assert all(p["ms"] > 0 and p["ratio"] > 0 for p in curve)


def test_read_bandwidth_reports_positive_rates():
    bw = read_bandwidth(threads=1, megabytes=8, repeats=2)
    assert bw["gbps"] > 0 and bw["numpy_gbps"] > 0 and bw["onnxruntime_gbps"] > 0
    assert bw["gbps"] == bw[f"{bw['method']}_gbps"]


def test_trtspec_runner_equals_local_generator(tiny):
    engine = tiny[1][0]
    rows = list(run_trtspec(str(engine), PROMPTS, max_tokens=6, threads=1))
    generator = LocalGenerator(engine, threads=1)
    expected = [generator.generate(ids, GenerationConfig(max_tokens=6, no_spec=True)).output_ids for ids in PROMPTS]
    assert [r["prompt"] for r in rows] == [0, 1, 2] and all(list(r["runs"]) == ["none"] for r in rows)
    assert plain_ids(rows) == expected
    assert all(0 < r["runs"]["none"]["ttft_s"] <= r["runs"]["none"]["total_s"] for r in rows)


def test_transformers_runner_agrees_with_trtspec(tiny):
    pytest.importorskip("transformers")
    base, engines = tiny
    ours = plain_ids(run_trtspec(str(engines[0]), PROMPTS, max_tokens=6, threads=1))
    rows = list(peers.run_transformers(str(base), [p * 3 for p in PROMPTS], max_tokens=6, threads=1, lookup=3))
    assert all(set(r["runs"]) == {"none", "lookup"} for r in rows)
    assert [r["runs"]["lookup"]["output_ids"] for r in rows] == plain_ids(rows)  # greedy: its lookup is lossless
    rows = list(peers.run_transformers(str(base), PROMPTS, max_tokens=6, threads=1))
    assert plain_ids(rows) == ours
    assert all(0 < r["runs"]["none"]["ttft_s"] <= r["runs"]["none"]["total_s"] for r in rows)


def _write_word_tokenizer(base: Path) -> None:
    """onnxruntime-genai's builder copies the base's tokenizer, so the tiny base needs one."""
    import tokenizers
    from tokenizers.models import WordLevel

    tokenizers.Tokenizer(WordLevel({f"t{i}": i for i in range(MODEL.vocab_size)}, unk_token="t0")).save(
        str(base / "tokenizer.json"))
    (base / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "t0"}')


def test_genai_runner_agrees_with_trtspec(tiny, tmp_path):
    for module in peers.GENAI_MODULES:
        pytest.importorskip(module)
    base = write_hf_base(tmp_path / "base", MODEL)
    _write_word_tokenizer(base)
    model = peers.build_genai_model(base, tmp_path / "genai", log=tmp_path / "genai.log")
    assert peers.build_genai_model(base, model, log=tmp_path / "again.log") == model  # cached: no second build
    assert not (tmp_path / "again.log").exists()
    rows = list(peers.run_genai(str(model), PROMPTS, max_tokens=6, threads=1))
    ours = plain_ids(run_trtspec(str(tiny[1][0]), PROMPTS, max_tokens=6, threads=1))
    assert plain_ids(rows) == ours
    assert all(0 < r["runs"]["none"]["ttft_s"] <= r["runs"]["none"]["total_s"] for r in rows)
    # its own n-gram speculation on the same ids, alternating with plain decoding prompt by prompt
    prompts = [p * 4 for p in PROMPTS]  # repeated text, so the lookup finds matches
    lookup = list(peers.run_genai(str(model), prompts, max_tokens=6, threads=1, lookup=(2, 3)))
    assert [r["prompt"] for r in lookup] == [0, 1, 2]
    assert [list(r["runs"]) for r in lookup] == [["none", "lookup"], ["lookup", "none"], ["none", "lookup"]]
    assert all(len(r["runs"]["lookup"]["output_ids"]) == 6 and r["runs"]["lookup"]["total_s"] > 0 for r in lookup)
    assert [r["runs"]["lookup"]["output_ids"] for r in lookup] == plain_ids(lookup)  # greedy: lossless too


def test_run_child_streams_rows_from_a_fresh_process(tiny, tmp_path):
    kwargs = {"engine": str(tiny[1][0]), "prompts": PROMPTS, "max_tokens": 4, "threads": 1}
    seen = []
    rows = run_child("benchmarks.cpu_engine:run_trtspec", kwargs, log=tmp_path / "log", on_row=seen.append)
    assert seen == rows and len(rows) == 3
    assert plain_ids(rows) == plain_ids(run_trtspec(**kwargs))


@pytest.mark.parametrize("function,message", [
    ("os:system", "expected trtspec.bench.<module>:<function>"),
    ("benchmarks.cpu_engine:run_trtspec", "failed in its child process"),  # no arguments
])
def test_run_child_errors_name_the_function(tmp_path, function, message):
    with pytest.raises(ConfigError, match=message):
        run_child(function, {}, log=tmp_path / "log")


def test_missing_peer_is_skipped_with_install_hint(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_engine, "missing_modules", lambda modules: list(modules)[:1])
    args = CpuBenchOptions(work=tmp_path)
    jobs, skipped = cpu_engine._decode_jobs(args, tiny[0], tiny[1][0], PROMPTS, tmp_path / "log")
    assert list(jobs) == ["trtspec", "trtspec --no-spin"]
    assert skipped["onnxruntime-genai"] == "onnxruntime_genai missing: pip install onnxruntime-genai onnx-ir"
    assert set(skipped) == {"onnxruntime-genai", "transformers"}


@pytest.mark.parametrize("spin,rows", [("both", {"trtspec": True, "trtspec --no-spin": False}),
                                       ("on", {"trtspec": True}), ("off", {"trtspec --no-spin": False})])
def test_spin_chooses_the_trtspec_rows_and_their_thread_policy(tiny, tmp_path, spin, rows):
    args = CpuBenchOptions(work=tmp_path, skip_peers=True, spin=spin)
    jobs, _ = cpu_engine._decode_jobs(args, tiny[0], tiny[1][0], PROMPTS, tmp_path / "log")
    assert {name: kwargs["spin"] for name, (_, kwargs) in jobs.items()} == rows


def test_run_trtspec_sets_the_spin_switch_for_its_process(tiny, monkeypatch):
    from trtspec.model.ort_session import SPIN_ENV

    monkeypatch.setenv(SPIN_ENV, "0")
    spinning = plain_ids(run_trtspec(str(tiny[1][0]), PROMPTS, max_tokens=4, threads=1, spin=True))
    assert os.environ[SPIN_ENV] == "1"
    assert spinning == plain_ids(run_trtspec(str(tiny[1][0]), PROMPTS, max_tokens=4, threads=1))


def plain_ids(rows) -> list[list[int]]:
    return [r["runs"]["none"]["output_ids"] for r in rows]


def _sample(prompt, ids, ttft, total, round_=0):
    return {"prompt": prompt, "output_ids": ids, "ttft_s": ttft, "total_s": total, "round": round_}


def test_summarize_uses_the_decode_rate_definition():
    rows = [_sample(0, [1] * 5, 0.1, 0.5), _sample(1, [1] * 9, 0.2, 1.0), _sample(2, [1], 0.1, 0.1)]
    s = summarize(rows)
    assert s["decode_tps"] == pytest.approx(10.0)  # (5 − 1) / 0.4 and (9 − 1) / 0.8; 1-token sample excluded
    assert s["e2e_tps"] == pytest.approx(10.0) and s["ttft_ms"] == pytest.approx(100.0) and s["samples"] == 3


def test_bandwidth_floor_divides_decode_time_by_weight_read_time(tmp_path):
    (tmp_path / "weights.bin").write_bytes(bytes(2_000_000))
    floor = cpu_engine.bandwidth_floor(tmp_path / "weights.bin", {"gbps": 1.0, "method": "numpy"}, decode_tps=250.0)
    assert floor["weight_bytes"] == 2_000_000 and floor["method"] == "numpy"
    assert floor["floor_ms"] == pytest.approx(2.0) and floor["decode_ms"] == pytest.approx(4.0)
    assert floor["ratio"] == pytest.approx(2.0)


def test_identical_outputs_counts_prompts_where_every_system_agrees():
    samples = {"a": [_sample(0, [1, 2], 0, 1), _sample(1, [3, 5, 6], 0, 1)],
               "b": [_sample(0, [1, 2], 0, 1), _sample(1, [3, 5, 7], 0, 1), _sample(1, [3, 5, 6], 0, 1, round_=1)],
               "c": [_sample(0, [1, 2], 0, 1), _sample(1, [3, 5, 6], 0, 1)]}
    differ = [{"prompt": 1, "first_diff": 2, "groups": [["a", "b", "c"], ["b"]]}]  # b changed between rounds
    assert identical_outputs(samples) == {"identical": 1, "prompts": 2, "differ": differ}


@pytest.mark.parametrize("argv, message", [
    (["--prompts", "0"], "--prompts must be >= 1"),
    (["--max-tokens", "-1"], "--max-tokens must be >= 1"),
    (["--spin", "sometimes"], "'sometimes' is not one of"),
])
def test_cli_refuses_bad_options_in_one_line(argv, message):
    from click.testing import CliRunner

    result = CliRunner().invoke(cli_main, argv)
    assert result.exit_code != 0 and message in result.output, result.output


def test_options_defaults():
    args = CpuBenchOptions(work=Path("w"))
    assert (args.prompts, args.max_tokens, args.threads, args.rounds, args.past, args.spin, args.skip_peers,
            args.png) == (10, 128, 2, 2, 256, "both", False, None)


def test_render_table_and_plot(tmp_path):
    curve = [{"k": 0, "slots": 1, "ms": 10.0, "ratio": 1.0}, {"k": 1, "slots": 2, "ms": 11.0, "ratio": 1.1}]
    row = {"samples": 2, "decode_tps": 30.0, "e2e_tps": 28.0, "ttft_ms": 250.0, "tokens": 128}
    report = {"settings": {"threads": 2, "prompts": 1, "rounds": 2, "max_tokens": 128, "past": 256, "repeats": 20,
                           "bandwidth_repeats": 7, "cpus": 2,
                           "load_average": {"before": (3.9, 3.1, 3.15), "after": (4.25, 3.5, 3.2)}},
              "decode": {"trtspec": row, "trtspec --no-spin": {**row, "decode_tps": 26.0},
                         "transformers": {**row, "decode_tps": 10.0}},
              "skipped": {"onnxruntime-genai": "onnxruntime_genai missing: pip install onnxruntime-genai onnx-ir"},
              "ratios": {"transformers": 3.0}, "ratios_no_spin": {"transformers": 2.6},
              "identical": {"identical": 1, "prompts": 2, "differ": [{"prompt": 1, "first_diff": 57,
                                                                      "groups": [["trtspec"], ["transformers"]]}]},
              "curve": curve,
              "floor": {"weight_bytes": 538e6, "gbps": 26.9, "method": "numpy", "buffer_mb": 1024, "floor_ms": 20.0,
                        "decode_ms": 33.3, "ratio": 1.665, "numpy_gbps": 26.9, "onnxruntime_gbps": 15.0,
                        "no_spin": {"decode_ms": 38.5, "ratio": 1.92}}}
    text = render_table(report)
    assert "trtspec ÷ transformers: 3.00× decode (target ≥ 3.0×)" in text
    assert "onnxruntime-genai     skipped: not installed (onnxruntime_genai missing" in text
    assert "token-identical across trtspec, trtspec --no-spin, transformers: 1/2 prompts" in text
    assert "  prompt 1: trtspec ≠ transformers from generated token 57" in text
    assert "    2    11.00   1.10×" in text
    assert "= 1.67× the floor (target ≤ 1.2×)" in text
    assert "trtspec --no-spin ÷ transformers: 2.60× decode (sleeping workers, for shared machines)" in text
    assert "trtspec --no-spin 38.5 ms/token = 1.92× the floor" in text
    assert "load average (1, 5, 15 min) before 3.9 / 3.1 / 3.1, after 4.2 / 3.5 / 3.2 on 2 CPUs" in text
    cpu_engine.plot_curve(curve, tmp_path / "curve.png", past=256)
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
