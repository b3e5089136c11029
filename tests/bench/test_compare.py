"""`trtspec bench` comparing tiny engines: fp32 (with Medusa heads) / int8 / int4 builds of one model, side by side
with onnxruntime-genai at fp32 and int4 built by its own builder from the same tiny HF folder; the verify curve, the
command and its errors; what benchmarks/ reads from a run: the weight bytes per token and the floors (floors.py), the
targets' arithmetic (peer_targets.py). No speed is asserted."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from benchmarks import floors, peer_targets
from benchmarks.floors import gguf_weight_bytes, onnx_weight_bytes
from benchmarks.peer_targets import targets
from trtspec.bench import compare
from trtspec.bench.compare import (CompareOptions, System, curve_from_samples, format_label, gguf_facts, measure_curve,
                                   merge_curves, render_table, run_compare, run_engine, summarize)
from trtspec.bench.peers import GENAI_MODULES, LLAMA_CPP_MODULES, missing_modules
from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

K = 8
SETS = ("mt-bench", "code-edit")  # a short set and a grounded one (the targets read grounded sets)
GENAI_MISSING = missing_modules(GENAI_MODULES)
LLAMA_PEERS = ("llama.cpp",)


def without_llama_cpp(mp: pytest.MonkeyPatch) -> None:
    """Block `import llama_cpp` here (a None entry in sys.modules) as if llama-cpp-python were not installed: the
    tiny model has no GGUF, so these tests check the peers' skip; tests/bench/test_llama_cpp_peer.py runs them on the
    real model."""
    mp.setitem(sys.modules, "llama_cpp", None)
    assert missing_modules(LLAMA_CPP_MODULES) == ["llama_cpp"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny model (tied embeddings, a real tiny BPE tokenizer, also copied into the HF folder for the peer's
    builder): fp32 with Medusa heads, int8 and int4 without, each K = 8."""
    root = tmp_path_factory.mktemp("formats")
    vocab = write_tiny_tokenizer(root / "tok")
    model = TinyModel(vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=4096)
    ckpt = tiny_trtllm_checkpoints(root, model, drafters=("none", "medusa"))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(root / "tok" / name, root / "base" / name)
    engines = {}
    for name, source, weights in (("fp32", "medusa", "fp32"), ("int8", "none", "int8"), ("int4", "none", "int4")):
        engines[name] = root / name
        build(BuildOptions(source=ckpt[source], out=engines[name], max_input_len=2048, max_seq_len=2304,
                           max_draft_len=K, weights=weights, tokenizer=root / "tok"))
    return {"root": root, "hf": root / "base", **engines}


@pytest.fixture(scope="module")
def report(tiny):
    """One real run over the three engines, onnxruntime-genai at fp32 and int4 (when installed) and llama.cpp (asked
    for, not importable here, so it must be skipped with its reason), with the verify curves."""
    peers = (() if GENAI_MISSING else ("onnxruntime-genai",)) + LLAMA_PEERS
    lines = []
    options = CompareOptions(engines=(tiny["fp32"], tiny["int8"], tiny["int4"]), peers=peers, hf=tiny["hf"],
                             sets=SETS, limit=1, max_tokens=8, threads=1, rounds=2, curves=True, past=16, repeats=1,
                             work=tiny["root"] / "work")
    with pytest.MonkeyPatch.context() as mp:
        without_llama_cpp(mp)
        return run_compare(options, show=lines.append, progress=False), lines


def test_every_engine_and_peer_decodes_the_same_prompts(report):
    report, _ = report
    expected = {"fp32", "int8", "int4"} | (set() if GENAI_MISSING else {"onnxruntime-genai fp32",
                                                                        "onnxruntime-genai int4"})
    assert set(report["systems"]) == expected
    assert report["sets"] == list(SETS)
    for entry in report["systems"].values():
        plain = entry["plain"]
        assert plain["all"]["runs"] == 2 * 2  # 2 prompts x 2 rounds
        assert plain["all"]["runs"] == sum(plain[s]["runs"] for s in SETS)
        assert plain["all"]["tokens_per_s"] > 0 and plain["all"]["tokens"] <= 4 * 8
    assert [report["systems"][e]["format"] for e in ("fp32", "int8", "int4")] == ["fp32", "int8 b32", "int4 b32"]


def test_speculation_per_engine_with_its_own_drafter(report):
    report, _ = report
    systems = report["systems"]
    assert list(systems["fp32"]["methods"]) == ["ngram", "medusa"]  # the engine's own drafter is added
    assert list(systems["int4"]["methods"]) == ["ngram"]
    for name in ("fp32", "int8", "int4"):
        for cells in systems[name]["methods"].values():
            assert cells["all"]["compared"] == 4 and cells["all"]["speedup"] > 0
            assert cells["all"]["tau"] is None or cells["all"]["tau"] >= 1
    for cells in systems["fp32"]["methods"].values():  # fp32 speculation is lossless
        assert cells["all"]["identical"] == cells["all"]["compared"]


def test_verify_curve_covers_every_slot_count(report):
    report, _ = report
    for name in ("fp32", "int8", "int4"):
        curve = report["systems"][name]["curve"]
        assert [p["slots"] for p in curve["points"]] == list(range(1, K + 2))
        assert curve["points"][0]["ratio"] == 1.0 and all(p["ms"] > 0 for p in curve["points"])
        costs = curve["step_costs"]
        assert costs["profiles"][0] == 1 and costs["profiles"][-1] == K + 1
        assert costs["step_ms"] == sorted(costs["step_ms"])  # levelled: no profile costs more than a larger one
        # measured in both rounds (the engines alternating), one timed step per slot count each: pooled
        assert curve["repeats"] == 2 and all(len(v) == 2 for v in curve["samples"].values())


def test_merged_curves_pool_their_samples_and_level_the_profiles():
    def part(samples):
        return curve_from_samples("e", 8, {str(n): v for n, v in samples.items()}, [1, 2, 3])

    merged = merge_curves([part({1: [10.0], 2: [12.0], 3: [11.0]}), part({1: [20.0, 30.0], 2: [14.0], 3: [15.0]})])
    assert merged["samples"] == {"1": [10.0, 20.0, 30.0], "2": [12.0, 14.0], "3": [11.0, 15.0]}
    assert [p["ms"] for p in merged["points"]] == [20.0, 13.0, 13.0]  # medians of the pooled samples
    assert merged["points"][1]["ratio"] == 0.65 and merged["repeats"] == 2
    assert merged["step_costs"]["step_ms"] == [13.0, 13.0, 13.0]  # levelled down to the larger profiles' cost


def test_floor_and_weight_bytes_per_format(report, tiny):
    """benchmarks/floors.py on a run's summary: every system weighed from the model file the summary names."""
    report, _ = report
    systems = floors.floors(json.loads(json.dumps(report)), {"gbps": 10.0, "method": "numpy", "threads": 1})
    read = {name: systems[name]["weights"]["read"] for name in ("fp32", "int8", "int4")}
    assert read["fp32"] > read["int8"] > read["int4"]
    for entry in systems.values():
        floor = entry["floor"]
        assert floor["weight_bytes"] == entry["weights"]["read"]
        assert floor["ratio"] == pytest.approx(floor["decode_ms"] / floor["floor_ms"], rel=1e-2)
    assert floors.weight_bytes("transformers", "hf") == {"read": None, "gathered": None}  # not weighed


def test_tied_quantized_embedding_is_counted_once_with_the_lm_head(tiny):
    """The int4 engine's embedding gathers the lm_head's own bytes: read whole by the lm_head, counted once."""
    import onnx

    engine = tiny["int4"]
    counted = onnx_weight_bytes(engine / "generation.onnx")
    assert counted["gathered"] == 0
    model = onnx.load(str(engine / "generation.onnx"), load_external_data=False)
    external = [{x.key: x.value for x in init.external_data} for init in model.graph.initializer]
    regions = {(e["offset"], e["length"]) for e in external if e}
    by_name = {init.name: (e.get("offset"), e.get("length")) for init, e in zip(model.graph.initializer, external)}
    assert by_name["embedding.q"] == by_name["lm_head.weight.q"]  # the codes the embedding gathers are the lm_head's
    in_graph = sum(floors._initializer_extent(init)[1] for init in model.graph.initializer
                   if not init.external_data)
    assert counted["read"] == sum(int(length) for _, length in regions) + in_graph


def test_untied_embedding_table_is_left_out(tmp_path):
    """An fp32 engine with an untied embedding reads its lm_head whole and gathers one row of the table."""
    vocab = write_tiny_tokenizer(tmp_path / "tok")
    model = TinyModel(vocab_size=vocab, tie_word_embeddings=False)
    ckpt = tiny_trtllm_checkpoints(tmp_path, model, drafters=("none",))["none"]
    build(BuildOptions(source=ckpt, out=tmp_path / "engine", max_input_len=32, max_seq_len=64, no_spec=True))
    counted = onnx_weight_bytes(tmp_path / "engine" / "generation.onnx")
    assert counted["gathered"] == vocab * model.hidden_size * 4


def test_gguf_weight_bytes_leave_an_untied_embedding_out(tmp_path):
    gguf = pytest.importorskip("gguf")
    for tied in (True, False):
        path = tmp_path / f"m{tied}.gguf"
        writer = gguf.GGUFWriter(str(path), "llama")
        writer.add_tensor("token_embd.weight", np.zeros((16, 8), np.float32))
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), np.float32))
        if not tied:
            writer.add_tensor("output.weight", np.zeros((16, 8), np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        expected = {"read": (16 * 8 + 8 * 8) * 4, "gathered": 0} if tied else {"read": (16 * 8 + 8 * 8) * 4,
                                                                               "gathered": 16 * 8 * 4}
        assert gguf_weight_bytes(path) == expected
        assert gguf_facts(path) == {"vocab_size": None, "format": "F32"}


def test_gguf_facts_name_the_blocks_and_the_lm_head(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(16)])
    writer.add_tensor("token_embd.weight", np.zeros((16, 32), np.float16))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((32, 32), np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.zeros(32, np.float16))  # 1-D: not a matrix of the blocks
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_facts(path) == {"vocab_size": 16, "format": "F32, lm_head F16"}


def test_a_peers_lookup_is_compared_with_its_own_plain_decoding():
    """A peer's rows: its lookup against its plain decoding of the same prompt and round: speedups, τ from its decode
    steps, identical outputs."""
    prompts = [{"set": "code-edit", "id": "a", "ids": [1]}, {"set": "code-edit", "id": "b", "ids": [2]}]
    systems = [System("llama.cpp Q4_1", "llama.cpp", "f", {}, "Q4_1", ("lookup",), "int4")]

    def run(out, total, steps=None):
        return {"output_ids": out, "ttft_s": 0.1, "total_s": total,
                **({} if steps is None else {"steps": steps, "drafted": 9})}

    samples = {"llama.cpp Q4_1": [
        {"prompt": 0, "round": 0, "runs": {"none": run([1, 2, 3, 4, 5], 1.1), "lookup": run([1, 2, 3, 4, 5], 0.6, 2)}},
        {"prompt": 1, "round": 0, "runs": {"none": run([7, 8, 9], 0.5), "lookup": run([7, 8, 0], 0.3, 2)}}]}
    report = summarize(systems, samples, prompts, {})
    cell = report["systems"]["llama.cpp Q4_1"]["methods"]["lookup"]["all"]
    assert report["systems"]["llama.cpp Q4_1"]["matches"] == "int4"
    assert cell["identical"] == 1 and cell["compared"] == 2
    assert cell["tau"] == pytest.approx((4 + 2) / 4)  # 6 tokens after the first in 4 decode steps
    assert cell["acceptance_rate"] == pytest.approx(2 / 18, abs=1e-3)
    assert cell["speedup"] == pytest.approx(1.6 / 0.9, abs=1e-3)
    assert cell["decode_speedup"] == pytest.approx((6 / 0.7) / (6 / 1.4), abs=1e-2)  # of rounded rates


def test_llama_cpp_missing_is_one_line_and_a_not_measured_target(report):
    report, lines = report
    hint = "llama_cpp not installed (bash scripts/setup-peers.sh builds llama-cpp-python from source)"
    assert [line for line in lines if line.startswith("llama.cpp")] == [f"llama.cpp: skipped, {hint}"]
    llama = [t for t in peer_targets.run_targets(report) if "llama.cpp" in t["name"]]
    assert llama and all(t["ok"] is None and "not installed" in t["reason"] for t in llama)


@pytest.mark.skipif(bool(GENAI_MISSING), reason=f"{', '.join(GENAI_MISSING)} not installed")
def test_genai_int4_peer_is_built_by_its_builder_and_compared(report, tiny):
    report, _ = report
    genai = report["systems"]["onnxruntime-genai int4"]
    for entry in (genai, report["systems"]["onnxruntime-genai fp32"]):  # its own n-gram lookup beside its plain
        assert list(entry["methods"]) == ["lookup"] and entry["methods"]["lookup"]["all"]["compared"] == 4
    config = json.loads((tiny["root"] / "work" / "genai-int4" / "genai_config.json").read_text())
    assert config["model"]["type"] == "llama"
    assert floors.weight_bytes("onnxruntime-genai", genai["model"])["read"] < \
        floors.weight_bytes("engine", report["systems"]["fp32"]["model"])["read"]
    found = peer_targets.run_targets(report)
    plain = [t for t in found if t["name"] == "int4 plain ÷ onnxruntime-genai int4 plain"]
    assert len(plain) == 1 and plain[0]["ok"] is not None
    assert plain[0]["value"] == pytest.approx(report["systems"]["int4"]["plain"]["all"]["decode_tokens_per_s"]
                                              / genai["plain"]["all"]["decode_tokens_per_s"], rel=1e-2)
    grounded = [t for t in found if "code-edit" in t["name"] and "onnxruntime-genai" in t["name"]]
    assert len(grounded) == 1 and grounded[0]["ok"] is not None


def test_render_table_names_every_system_and_target(report):
    report, _ = report
    text = "\n".join(render_table(report))
    for label in report["systems"]:
        assert label in text
    assert "llama.cpp" in text and "targets" not in text  # benchmarks/peer_targets.py sets them
    found = peer_targets.run_targets(report)
    text = "\n".join(peer_targets.render(found))
    assert text.count("PASS") + text.count("FAIL") + text.count("not measured") == len(found) > 0


def test_run_engine_plain_rows_equal_the_generator(tiny):
    prompts = [[1, 5, 9, 13], [2, 4, 8, 16, 32, 3, 7]]
    first, *rows = run_engine(str(tiny["int4"]), prompts, methods=["ngram"], max_tokens=6, threads=1)
    assert first["step_costs"]["profiles"][0] == 1
    generator = LocalGenerator(tiny["int4"], threads=1)
    expected = [generator.generate(ids, GenerationConfig(max_tokens=6, no_spec=True)).output_ids for ids in prompts]
    assert [r["runs"]["none"]["output_ids"] for r in rows] == expected
    assert all(set(r["runs"]) == {"none", "ngram"} for r in rows)


def test_measure_curve_step_costs_drive_the_drafters(tiny):
    curve = measure_curve(str(tiny["fp32"]), threads=1, past=8, repeats=1)
    first, *rows = run_engine(str(tiny["fp32"]), [[1, 2, 3]], methods=["ngram"], max_tokens=4, threads=1,
                              step_costs=curve["step_costs"])
    assert len(rows) == 1 and first["step_costs"]["relative"] == curve["step_costs"]["relative"]
    bad = {**curve["step_costs"], "profiles": [1, 2]}
    bad["relative"], bad["step_ms"] = bad["relative"][:2], bad["step_ms"][:2]
    with pytest.raises(ConfigError, match="does not fit"):
        list(run_engine(str(tiny["fp32"]), [[1, 2, 3]], methods=["ngram"], max_tokens=4, threads=1, step_costs=bad))


def _report(tps: dict[str, dict[str, float]], spec: dict[str, float], kinds: dict[str, str] | None = None) -> dict:
    kinds = kinds or {}
    systems = {}
    for label, per_set in tps.items():
        kind = kinds.get(label, "engine")
        systems[label] = {"kind": kind, "format": "int4 b32" if label == "int4" else "fp32", "methods": {},
                          "plain": {s: {"decode_tokens_per_s": v} for s, v in per_set.items()}}
        if kind == "engine":
            systems[label]["methods"] = {"ngram": {s: {"decode_tokens_per_s": v, "identical": 2, "compared": 2}
                                                   for s, v in spec.items()}}
        else:
            systems[label]["matches"] = "int4"
    return {"systems": systems, "sets": ["code-edit"]}


def test_targets_pass_fail_and_not_measured():
    kinds = {"genai": "onnxruntime-genai", "llama": "llama.cpp"}
    tps = {"int4": {"all": 90.0, "code-edit": 90.0}, "genai": {"all": 100.0, "code-edit": 100.0},
           "llama": {"all": 70.0, "code-edit": 70.0}}
    result = {t["name"]: t for t in targets(_report(tps, {"all": 160.0, "code-edit": 160.0}, kinds), {},
                                            ("onnxruntime-genai", "llama.cpp"))}
    assert result["int4 plain ÷ onnxruntime-genai int4 plain"]["ok"] is False  # 0.9x < 1.0x
    assert result["int4 + ngram ÷ genai plain on code-edit"]["ok"] is True  # 1.6x >= 1.5x
    assert result["int4 + ngram ÷ llama plain on code-edit"]["ok"] is True  # 2.29x >= 2x
    assert result["int4 + ngram ÷ llama plain on code-edit"]["value"] == pytest.approx(160 / 70, abs=1e-3)
    missing = targets(_report({"int4": tps["int4"]}, {"all": 1.0, "code-edit": 1.0}), {"llama.cpp": "not here"})
    assert all(t["ok"] is None for t in missing)
    assert {t["reason"] for t in missing} == {"--peers without onnxruntime-genai", "not here",
                                              "--peers without openvino"}
    assert targets(_report({"fp32": tps["int4"]}, {"all": 1.0}), {}) == []  # no int4 or int8 engine: none


def test_format_label():
    assert format_label({}) == "fp32"
    q = {"dtype": "int4", "block_size": 64}
    assert format_label({"linear": q, "lm_head": q}) == "int4 b64"
    assert format_label({"linear": q, "lm_head": {"dtype": "int8", "block_size": 32}}) == "int4 b64, lm_head int8 b32"


def test_options_refuse_bad_input(tiny):
    engines = (tiny["fp32"],)
    with pytest.raises(ConfigError, match="--peers foo: unknown peer"):
        CompareOptions(engines=engines, peers=("foo",), hf=tiny["hf"])
    with pytest.raises(ConfigError, match="needs --hf"):
        CompareOptions(engines=engines, peers=("onnxruntime-genai",))
    with pytest.raises(ConfigError, match="--peers llama.cpp: needs --hf"):
        CompareOptions(engines=engines, peers=("llama.cpp",))
    CompareOptions(engines=engines, peers=("llama.cpp",), gguf=tiny["root"] / "m.gguf")
    with pytest.raises(ConfigError, match="--limit 0"):
        CompareOptions(engines=engines, peers=(), limit=0)
    with pytest.raises(ConfigError, match="--methods none"):
        CompareOptions(engines=engines, peers=(), methods=("none",))
    with pytest.raises(ConfigError, match="--llama-lookup 2,0: give N,K"):
        CompareOptions(engines=engines, peers=(), llama_lookup=(2, 0))


def test_two_turn_set_follows_the_first_engines_answer(tiny, tmp_path):
    """mt-bench-2turn's second turn after the first engine's plain greedy first answer: the same ids for every
    system."""
    from trtspec.bench.workload import load_bench_prompts

    engines = [compare.read_engine(tiny["int8"]), compare.read_engine(tiny["int4"])]
    prompts = compare.prompt_ids(engines, ("mt-bench-2turn",), 1, 4, log=tmp_path / "log", show=lambda line: None,
                                 threads=1)
    generator = LocalGenerator(tiny["int8"], threads=1)
    (expected,) = load_bench_prompts("mt-bench-2turn", limit=1, generator=generator, max_tokens=4,
                                     show=lambda line: None)
    assert [p["ids"] for p in prompts] == [list(expected.ids)]
    assert [m["role"] for m in expected.messages][-3:] == ["user", "assistant", "user"]  # the engine's answer between


def test_foreign_engine_refused(tiny, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny["int4"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["model"]["vocab_size"] += 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="vocabulary of"):
        run_compare(CompareOptions(engines=(tiny["fp32"], other), peers=(), work=tmp_path),
                      show=lambda line: None, progress=False)
    # a drafter an engine does not run (Medusa on engines without heads): one line before anything is measured
    with pytest.raises(ConfigError, match=r"--methods medusa: .*int4.* does not run it; it runs none, ngram, suffix, "
                                          r"lookahead"):
        run_compare(CompareOptions(engines=(tiny["fp32"], tiny["int4"]), peers=(), methods=("medusa",),
                                     work=tmp_path), show=lambda line: None, progress=False)


def test_command_writes_summary_and_png(tiny, tmp_path, monkeypatch):
    without_llama_cpp(monkeypatch)
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["bench", str(tiny["int8"]), str(tiny["int4"]),
                                      "--peers", ",".join(LLAMA_PEERS),
                                      "--hf", str(tiny["hf"]), "--sets", "mt-bench", "--limit", "1", "--max-tokens",
                                      "4", "--threads", "1", "--curves", "--past", "8", "--repeats", "1",
                                      "--work", str(tmp_path / "work"), "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["systems"]) == {"int8", "int4"}
    assert (out / "compare.png").read_bytes()[:4] == b"\x89PNG"
    result = CliRunner().invoke(peer_targets.main, [str(out / "summary.json")])
    assert result.exit_code == 0, result.output
    assert "int4 + speculation on grounded sets" in result.output  # mt-bench only: no grounded set
    assert "no grounded set in --sets" in result.output
    bandwidth = {"gbps": 10.0, "method": "numpy", "threads": 1, "buffer_mb": 8}  # not measured: no 1 GiB buffer here
    monkeypatch.setattr(floors, "read_bandwidth", lambda **kwargs: bandwidth)
    result = CliRunner().invoke(floors.main, [str(out / "summary.json")])
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines()[1:3]}
    assert set(rows) == {"int8", "int4"} and all(line.endswith("×") for line in rows.values())
    assert "10.0 GB/s" in result.output


def test_command_unknown_peer_is_one_line(tiny):
    result = CliRunner().invoke(cli, ["bench", str(tiny["int4"]), "--peers", "vllm"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == ("error: --peers vllm: unknown peer; choose from "
                                                      "transformers, onnxruntime-genai, llama.cpp, openvino")


def test_llama_cpp_gguf_from_the_hf_record(tmp_path):
    with pytest.raises(ConfigError, match="--gguf FILE"):
        compare.llama_cpp_gguf(tmp_path)
