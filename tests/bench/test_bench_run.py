"""`trtspec bench ENGINE` on a tiny Medusa engine with a tiny tokenizer: the figures, files and table, that they
agree with `generate --json` on the same prompts, the routing of the bench group, and a served run (slow).
No speed is asserted."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from trtspec.bench.bench_outputs import format_table as format_bench_table
from trtspec.bench.bench_outputs import write_outputs as write_bench_outputs
from trtspec.bench.runner import BenchOptions, run_bench
from trtspec.bench.summary import PLAIN
from trtspec.cli import cli
from trtspec.errors import ConfigError
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing import tiny_engine

PROMPTS = [("a", "code", "def add(a, b): return a + b. Rewrite add so that it adds three numbers."),
           ("b", "text", "The quick brown fox jumps over the lazy dog. Repeat the sentence twice."),
           ("c", "text", "Hello world"),
           ("d", "code", "print('Hello world') print('Hello world') print")]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    return tiny_engine(tmp_path_factory.mktemp("bench-run"), max_input_len=128, max_seq_len=192, max_batch_size=4)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": i, "category": c, "prompt": p}) + "\n" for i, c, p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def run(engine, prompt_file):
    # whole trees (no back-off): the random heads' drafts would rest, and the figures of drafting are the point here
    options = BenchOptions(engine=engine, prompt_set=str(prompt_file), limit=None, methods=("medusa", "ngram"),
                           concurrency=(1, 4), max_tokens=24, threads=1, show_progress=False, backoff=False)
    return run_bench(options, show=lambda line: None)


def test_every_method_and_concurrency_is_measured_and_lossless(run):
    report = run.report
    assert report["methods"] == [PLAIN, "medusa", "ngram"] and report["concurrency"] == [1, 4]
    assert len(run.records) == len(PROMPTS) * 3 * 2
    for concurrency in ("1", "4"):
        methods = report["results"][concurrency]
        assert set(methods) == {PLAIN, "medusa", "ngram"}
        for method, figures in methods.items():
            overall = figures["overall"]
            assert overall["requests"] == len(PROMPTS)
            assert overall["identical"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
            assert set(figures["categories"]) == {"code", "text"}
            assert sum(g["requests"] for g in figures["categories"].values()) == len(PROMPTS)
            for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
                dist = overall[key]
                assert 0 < dist["p50"] <= dist["p90"] <= dist["p99"], (method, key, dist)
            assert overall["output_tokens_per_s"] > 0 and overall["request_throughput"] > 0
            assert overall["speedup"] > 0
        assert methods[PLAIN]["overall"]["tau"] == 1.0 and methods[PLAIN]["overall"]["draft_tokens"] == 0
        assert methods[PLAIN]["overall"]["speedup"] == 1.0
        medusa = methods["medusa"]["overall"]
        assert medusa["draft_tokens"] > 0 and 1.0 <= medusa["tau"]
        assert medusa["tau"] == pytest.approx(1 + medusa["accepted_tokens"] / medusa["steps"], abs=1e-3)
        assert len(medusa["per_position_acceptance"]) >= 1


def test_records_agree_with_generate_json(run, engine, prompt_file):
    """The same prompts through `trtspec generate --json`: the same outputs, and the same τ and steps per prompt."""
    for method in ("medusa", PLAIN):
        extra = ("--no-spec",) if method == PLAIN else ("--method", method, "--no-backoff")
        result = CliRunner().invoke(cli, ["generate", str(engine), "--prompts", str(prompt_file), "--max-tokens", "24",
                                          "--threads", "1", "--json", *extra])
        assert result.exit_code == 0, result.output
        rows = [json.loads(line) for line in result.output.splitlines()]
        mine = [r for r in run.records if r.method == method and r.concurrency == 1]
        assert [r.prompt_id for r in mine] == [i for i, _, _ in PROMPTS]
        assert [list(r.output_ids) for r in mine] == [row["output_ids"] for row in rows]
        assert [r.steps for r in mine] == [row["stats"]["steps"] for row in rows]
        assert [round(r.tau, 4) for r in mine] == [row["stats"]["acceptance_length"] for row in rows]
        assert [r.accepted_tokens for r in mine] == [row["stats"]["accepted_tokens"] for row in rows]


def test_chunks_are_steps(run):
    """In process the prefill and each verify step stream one chunk: an ITL sample per step; TPOT is the decode
    time per token after the first."""
    for r in run.records:
        assert len(r.itl_ms) == r.steps
        if r.output_tokens > 1:
            assert r.tpot_ms == pytest.approx((r.e2e_ms - r.ttft_ms) / (r.output_tokens - 1), rel=1e-3, abs=1e-3)


def test_cli_routes_engine_to_run_and_writes_outputs(engine, prompt_file, tmp_path):
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["bench", str(engine), "--prompt-set", str(prompt_file), "--limit", "2",
                                      "--method", "ngram", "--max-tokens", "8", "--threads", "1", "--no-progress",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "trtspec bench" in result.output and "ngram" in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"] == [PLAIN, "ngram"] and summary["prompts"] == 2
    rows = list(csv.DictReader((out / "requests.csv").open()))
    assert len(rows) == 4 and {r["method"] for r in rows} == {PLAIN, "ngram"}
    for png in ("categories.png", "acceptance.png", "concurrency.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "open_loop.png").exists()  # no --request-rate


def test_plots_name_what_was_measured_and_show_the_levels(run, monkeypatch, tmp_path):
    """Every plot's title names the target, the mode, the prompt set and n; concurrency ticks are the measured levels,
    value axes start at zero, depth ticks are integers, and the concurrency plot has a speedup panel."""
    import matplotlib.pyplot as plt

    from trtspec.bench import bench_outputs

    figures = {}
    monkeypatch.setattr(bench_outputs, "save_figure", lambda fig, path: figures.__setitem__(path.name, fig))
    written = bench_outputs.write_outputs(run, tmp_path)
    assert set(written) == {"summary", "requests", "categories.png", "acceptance.png", "concurrency.png"}
    for name, fig in figures.items():
        title = fig._suptitle.get_text()
        assert str(run.report["target"]) in title and "in-process" in title, (name, title)
        assert f"n = {len(PROMPTS)} prompts" in title and run.report["prompt_set"] in title
    concurrency = figures[next(n for n in figures if "concurrency" in n)]
    assert [ax.get_title() for ax in concurrency.axes] == ["output tokens/s", "speedup over plain decoding",
                                                            "TPOT p50 (ms)", "TTFT p50 (ms)"]
    for ax in concurrency.axes:
        assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "4"]
        assert ax.get_ylim()[0] == 0
    (depth_ax,) = figures[next(n for n in figures if "acceptance" in n)].axes
    assert all(float(t).is_integer() for t in depth_ax.get_xticks())
    for fig in figures.values():
        plt.close(fig)


def test_transformers_peer_in_the_same_run(engine, prompt_file, tmp_path):
    pytest.importorskip("transformers")
    from trtspec.bench.compare import CompareOptions, run_compare

    options = CompareOptions(engines=(engine,), sets=(str(prompt_file),), limit=3, max_tokens=8, threads=1,
                             peers=("transformers",), hf=engine.parent / "base", peer_limit=2, work=tmp_path)
    report = run_compare(options, show=lambda line: None, progress=False)
    peer = report["systems"]["transformers fp32"]
    assert peer["plain"]["all"]["runs"] == 2 and report["systems"]["engine"]["plain"]["all"]["runs"] == 3
    lookup = peer["methods"]["lookup"]["all"]
    assert (lookup["identical"], lookup["compared"]) == (2, 2) and lookup["speedup"] > 0


@pytest.mark.parametrize("args, message", [
    (["bench", "--prompt-set", "x.jsonl"], "pass ENGINE_DIR or --url"),
    (["bench", "run", "{engine}", "--concurrency", "1,x"], "comma-separated"),
    (["bench", "{engine}", "--method", "none"], "plain decoding always runs"),
    (["bench", "{engine}", "--peers", "transformers"], "--peers transformers: needs --hf DIR"),
    (["bench", "{engine}", "{engine}", "--concurrency", "4"], "--concurrency measures requests on one engine"),
    (["bench", "{engine}", "--hf", "{engine}"], "--hf is the peers' model folder"),
    (["bench", "--url", "127.0.0.1:1", "--serve"], "--serve deploys and serves ENGINE_DIR itself"),
    (["bench", "{engine}", "--no-spec", "--method", "ngram"], "--no-spec measures plain decoding alone"),
    (["bench", "{engine}", "--prompt-set", "{prompts}", "--concurrency", "8"], "exceeds the engine's max_batch_size"),
    (["bench", "{engine}", "--request-rate", "2"], "--request-rate sends requests as they arrive to a served "
                                                   "deployment: pass --url HOST:PORT alone"),
    (["bench", "--url", "127.0.0.1:1", "--request-rate", "0"], "--request-rate must be positive"),
    (["bench", "{engine}", "--goodput", "ttft:500"], "--goodput counts the requests that meet its SLOs"),
    (["bench", "--url", "127.0.0.1:1", "--request-rate", "1", "--goodput", "ttft:fast"],
     "--goodput ttft:fast: expected NAME:MS pairs with NAME one of ttft, tpot, e2el"),
    (["bench", "{engine}", "{engine}", "--request-rate", "1"], "--request-rate measures requests on one engine"),
])
def test_cli_errors_are_one_line(engine, prompt_file, args, message):
    args = [a.format(engine=engine, prompts=prompt_file) for a in args]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code != 0 and message in result.output, result.output


@pytest.mark.parametrize("args, expected", [
    (["bench", "--help"], "soak"),
    (["bench", "run", "--help"], "--concurrency"),
    (["bench", "soak", "--help"], "--users"),
    (["bench", "run", "--help"], "--genai-lookup"),
    (["bench", "serving", "--help"], "--concurrency"),
    (["bench", "perf-input", "--help"], "--input-data"),
])
def test_bench_group_help(args, expected):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0 and expected in result.output, result.output


def test_unary_against_streaming_is_a_benchmark_of_its_own():
    """`bench serving --unary` moved to benchmarks/unary_streaming.py: its command and its one line."""
    from benchmarks.unary_streaming import format_unary, main

    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0 and "--limit" in result.output and "--rounds" in result.output
    report = {"requests": 8, "streaming": {"wall_s": 2.0, "tok_s": 64.0}, "unary": {"wall_s": 1.0, "tok_s": 128.0},
              "unary_over_streaming": 0.5, "outputs_identical": True}
    assert format_unary(report) == ("8 concurrent requests: streaming 2.0 s (64.0 tok/s), unary 1.0 s (128.0 tok/s), "
                                    "unary / streaming = 0.5; outputs identical: True")


def test_compare_command_keeps_the_gates_figures(engine, prompt_file, tmp_path):
    """`trtspec bench ENGINE --sets ...` compares; its cells keep the figures the recipe gate reads."""
    from trtspec.recipe.gate import FIGURES

    result = CliRunner().invoke(cli, ["bench", str(engine), "--sets", str(prompt_file), "--methods", "ngram",
                                      "--limit", "2", "--max-tokens", "8", "--threads", "1", "--no-spin",
                                      "--work", str(tmp_path), "--json", "--no-progress"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    methods = report["systems"]["engine"]["methods"]
    assert list(methods) == ["ngram", "medusa"]  # the engine's own drafter is added
    cell = methods["medusa"][str(prompt_file)]
    assert (cell["identical"], cell["compared"]) == (2, 2)
    assert set(FIGURES) <= set(cell) and report["settings"]["spin"] is False


def test_compare_measures_each_engine_against_its_own_plain_decoding(engine, prompt_file, tmp_path):
    from dataclasses import replace

    from trtspec.bench.compare import CompareOptions, run_compare
    from trtspec.testing import TinyModel

    other = tiny_engine(tmp_path, replace(TinyModel(), num_layers=3), drafter="none", max_draft_len=8,
                        max_input_len=128, max_seq_len=192).rename(tmp_path / "deeper")
    args = dict(sets=(str(prompt_file),), limit=2, max_tokens=8, threads=1, spin=False, work=tmp_path / "w")
    report = run_compare(CompareOptions(engines=(engine, other), methods=("ngram",), own_drafter=False, **args),
                         show=lambda line: None, progress=False)
    for name in ("engine", "deeper"):
        cell = report["systems"][name]["methods"]["ngram"][str(prompt_file)]
        assert (cell["identical"], cell["compared"]) == (2, 2)
    with pytest.raises(ConfigError, match="different names"):
        run_compare(CompareOptions(engines=(engine, engine), **args), show=lambda line: None, progress=False)


def test_two_turn_set_needs_an_engine():
    with pytest.raises(ConfigError, match="two-turn"):
        from trtspec.bench.workload import load_bench_prompts

        load_bench_prompts("mt-bench-2turn", limit=1)


def test_limit_takes_a_set_stored_by_category_across_its_categories(prompt_file):
    """MT-Bench lists ten writing prompts first: --limit 8 measures one of each category; sets with a measurement
    split and prompt files keep their order."""
    from trtspec.bench.workload import load_bench_prompts, spreads
    from trtspec.data.prompts import PROMPT_SETS, load_prompts

    eight = load_bench_prompts("mt-bench", limit=8)
    assert [p.category for p in eight] == list(PROMPT_SETS["mt-bench"].categories)
    assert spreads("mt-bench") and spreads("champ") and not spreads("humaneval")
    assert not spreads("sharegpt-grounded") and not spreads(str(prompt_file))
    assert [p.id for p in load_bench_prompts("code-edit", limit=3)] == [
        p.id for p in load_prompts("code-edit", split="measure", limit=3)]
    assert [p.id for p in load_bench_prompts(str(prompt_file), limit=2)] == [
        p.id for p in load_prompts(str(prompt_file), limit=2)]


@pytest.mark.slow
def test_serving_mode_measures_the_engine_in_process_and_served(engine, prompt_file, tmp_path):
    """`bench serving` (= `bench ENGINE --serve`): every request in process and through a real tritonserver, the
    served ÷ in-process ratio, identical outputs across both and against plain decoding, the engine's batching."""
    result = CliRunner().invoke(cli, ["bench", "serving", str(engine), "--prompt-set", str(prompt_file), "--limit",
                                      "3", "--max-tokens", "8", "--concurrency", "2", "--threads", "1", "--json",
                                      "--no-progress", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["mode"] == "in-process and served" and report["methods"] == [PLAIN, "medusa"]
    assert set(report["results"]) == set(report["served"]["results"]) == {"1", "2"}
    for c in ("1", "2"):
        level = report["serving"][c]
        for method in (PLAIN, "medusa"):
            m = level["methods"][method]
            assert m["outputs_identical"] == "3/3" and m["ratio"] > 0 and m["served_ttft_ms_p50"] > 0
            served = report["served"]["results"][c][method]["overall"]
            assert served["identical"] == "3/3" and served["input_tokens"] > 0
        assert level["engine_batching"]["steps"] > 0
    # the engine's batching figures: one client's requests, one after another, run one sequence per step; two
    # clients' at most two (whether their requests overlapped depends on when they arrive, i.e. on the machine's
    # load: test_server.py's unary test counts shared steps with controlled arrival)
    assert report["serving"]["1"]["engine_batching"]["sequences_per_step"] == 1.0
    assert 1.0 <= report["serving"]["2"]["engine_batching"]["sequences_per_step"] <= 2.0
    with open(tmp_path / "out" / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert {r["target"] for r in rows} == {"in-process", "served"} and len(rows) == 3 * 2 * 2 * 2
    table = CliRunner().invoke(cli, ["bench", str(engine), "--serve", "--prompt-set", str(prompt_file), "--limit",
                                     "1", "--max-tokens", "4", "--threads", "1", "--no-spec", "--no-progress"])
    assert table.exit_code == 0, table.output
    assert "served ÷ in-process, concurrency 1, none" in table.stdout and "target ≥ 0.9" in table.stdout


@pytest.mark.slow
def test_served_engine_figures_match_in_process(engine, prompt_file, run, tmp_path):
    """--url against a real tritonserver serving the same engine: the same outputs, input tokens and acceptance per
    prompt."""
    from trtspec.triton.deploy import DeployOptions, deploy
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    repo = deploy(DeployOptions(engine_dir=engine, out=tmp_path / "repo", threads=1, backoff=False))  # as `run`
    server = TritonServer(ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                        metrics_port=free_port(), exit_timeout_s=5), on_log=lambda line: None)
    with server:
        served = run_bench(BenchOptions(url=server.grpc_url, prompt_set=str(prompt_file), limit=None,
                                        methods=("medusa", "ngram"), concurrency=(1, 2), max_tokens=24,
                                        show_progress=False), show=lambda line: None)
        open_loop = run_bench(BenchOptions(url=server.grpc_url, prompt_set=str(prompt_file), limit=None,
                                           methods=("medusa",), concurrency=(), request_rate=(20.0,),
                                           goodput={"e2el": 1e9}, max_tokens=24, show_progress=False),
                              show=lambda line: None)
    assert served.report["mode"] == "served" and served.report["notes"] == []  # no drafter that looks up answers
    assert run.report["notes"] == []
    for method in ("medusa", PLAIN):
        local = [r for r in run.records if r.method == method and r.concurrency == 1]
        remote = [r for r in served.records if r.method == method and r.concurrency == 1]
        assert [r.output_ids for r in remote] == [r.output_ids for r in local]
        assert [r.accepted_tokens for r in remote] == [r.accepted_tokens for r in local]
        assert [r.steps for r in remote] == [r.steps for r in local]
        assert [r.stats.per_position_acceptance for r in remote] == [r.stats.per_position_acceptance for r in local]
        # input tokens as the server counted them (the chat template applied), as in process
        assert [r.input_tokens for r in remote] == [r.input_tokens for r in local] and min(
            r.input_tokens for r in remote) > 0
    for concurrency in ("1", "2"):
        for figures in served.report["results"][concurrency].values():
            assert figures["overall"]["identical"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
            assert figures["overall"]["ttft_ms"]["p50"] > 0
    # the open loop: every prompt at its Poisson arrival, whatever is in flight; the same outputs as in process
    for method in ("medusa", PLAIN):
        local = [r.output_ids for r in run.records if r.method == method and r.concurrency == 1]
        remote = [r for r in open_loop.records if r.method == method]
        assert [r.output_ids for r in remote] == local
        assert {(r.concurrency, r.request_rate) for r in remote} == {(0, 20.0)}
    assert open_loop.report["results"] == {} and open_loop.report["request_rate"] == [20.0]
    level = open_loop.report["open_loop"]["results"]["20"]
    for figures in level.values():
        assert figures["requests"] == len(PROMPTS) and figures["identical"] == f"{len(PROMPTS)}/{len(PROMPTS)}"
        assert figures["met_slos"] == f"{len(PROMPTS)}/{len(PROMPTS)}"  # an SLO no request can miss
        assert figures["goodput"] == figures["request_throughput"] > 0
    table = "\n".join(format_bench_table(open_loop.report))
    assert "open loop (Poisson arrivals): goodput counts requests within e2el 1e+09 ms" in table
    written = write_bench_outputs(open_loop, tmp_path / "open")
    assert "open_loop.png" in written and "concurrency.png" not in written  # no closed-loop level ran
    rows = list(csv.DictReader((tmp_path / "open" / "requests.csv").open()))
    assert {r["request_rate"] for r in rows} == {"20.0"} and len(rows) == 2 * len(PROMPTS)


def test_in_process_ttft_counts_from_arrival_as_a_served_client_does(engine, prompt_file):
    """Sequences that join the batch together prefill one after another: the later ones' TTFT includes the earlier
    prefills (as a served request's does), and a request that joins when a row frees counts from that moment."""
    from trtspec.bench.workload import LocalTarget, _queue_waits, load_bench_prompts
    from trtspec.runtime.generator import LocalGenerator

    assert _queue_waits(10.0, [(10.0, 5.0), (10.5, 2.0), (12.6, 1.0)], 2) == pytest.approx([0.0, 0.5, 0.1])
    generator = LocalGenerator(engine, threads=1)
    prompts = load_bench_prompts(str(prompt_file), limit=None, generator=generator, max_tokens=8)
    timed, _ = LocalTarget(generator).run(prompts, GenerationConfig(max_tokens=8, no_spec=True), 4)
    ttfts = [t.ttft_s for t in timed]
    assert ttfts == sorted(ttfts) and len(set(ttfts)) == len(ttfts)
    assert all(t.chunk_s[0] == pytest.approx(t.ttft_s) for t in timed)


def test_a_prompt_file_of_token_ids_is_measured_as_its_ids(engine, tmp_path):
    """JSONL lines of "input_ids" are sent as they are, in requests mode and when comparing (not encoded as empty
    messages)."""
    from trtspec.bench.compare import CompareOptions, run_compare

    ids_file = tmp_path / "ids.jsonl"
    ids_file.write_text("".join(json.dumps({"id": f"p{i}", "input_ids": [5 + i, 9, 13, 5, 9, 13]}) + "\n"
                                for i in range(2)))
    run = run_bench(BenchOptions(engine=engine, prompt_set=str(ids_file), limit=None, methods=("ngram",),
                                 max_tokens=6, threads=1, show_progress=False), show=lambda line: None)
    assert run.report["prompts"] == 2
    assert all(r.input_tokens == 6 for r in run.records)
    report = run_compare(CompareOptions(engines=(engine,), sets=(str(ids_file),), limit=2, max_tokens=6, threads=1,
                                        methods=("ngram",), own_drafter=False, work=tmp_path / "w"),
                         show=lambda line: None, progress=False)
    assert report["systems"]["engine"]["plain"]["all"]["runs"] == 2


def test_one_harness_rotates_and_configures_every_method():
    """The loop both modes share: the methods' order turns by one per prompt or group (peers.rotated, alternate's
    `before` hook ahead of each prompt), and one request's settings per method (workload.method_configs)."""
    from trtspec.bench.peers import alternate, rotated
    from trtspec.bench.workload import method_configs

    assert rotated(["a", "b", "c"], 4) == ["b", "c", "a"]
    calls, seen = [], []
    runners = {name: (lambda ids, n, name=name: calls.append((name, ids[0], n)) or name) for name in ("x", "y")}
    rows = list(alternate([[1], [2]], 5, runners, before=seen.append))
    assert seen == [0, 1] and [list(r["runs"]) for r in rows] == [["x", "y"], ["y", "x"]]
    assert calls[:2] == [("x", 1, 8), ("y", 1, 8)]  # the warm-up, WARMUP_TOKENS each
    configs = method_configs(GenerationConfig(max_tokens=7), ["spec", "ngram:full", "suffix"])
    assert list(configs) == [PLAIN, "spec", "ngram:full", "suffix"] and configs[PLAIN].no_spec
    assert configs["spec"].method is None and not configs["spec"].no_spec
    assert (configs["ngram:full"].method, configs["ngram:full"].backoff) == ("ngram", False)
    assert configs["suffix"].backoff and all(c.max_tokens == 7 for c in configs.values())
