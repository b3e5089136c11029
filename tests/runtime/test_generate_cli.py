"""`trtspec generate` on a tiny engine: JSON output, speculation on / off identical, clear errors."""

from __future__ import annotations

import json
import re
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints

MODEL = TinyModel(vocab_size=64)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    ckpt = tiny_trtllm_checkpoints(root, MODEL, ("medusa",))["medusa"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=64, max_seq_len=128,
                       max_batch_size=4))
    return root / "engine"


@pytest.fixture
def prompts_file(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"input_ids": rng.integers(0, 64, int(n)).tolist()}) + "\n"
                            for n in rng.integers(1, 40, 10)))
    return path


def _run(*args):
    return CliRunner().invoke(cli, ["generate", *map(str, args)])


def test_json_lines_and_speculation_off_identical(engine, prompts_file):
    # --no-backoff: the random heads' drafts never pay, and the full tree is drafted every step all the same
    spec, plain = (_run(engine, "--prompts", prompts_file, "--max-tokens", 24, "--json", *extra)
                   for extra in (("--no-backoff",), ("--no-spec",)))
    assert spec.exit_code == 0 and plain.exit_code == 0, spec.output + plain.output
    spec_rows, plain_rows = ([json.loads(line) for line in r.output.splitlines()] for r in (spec, plain))
    assert [r["prompt_index"] for r in spec_rows] == list(range(10))
    assert [r["output_ids"] for r in spec_rows] == [r["output_ids"] for r in plain_rows]
    stats = spec_rows[0]["stats"]
    assert set(stats) == {"steps", "draft_tokens", "accepted_tokens", "acceptance_rate", "acceptance_length",
                          "ttft_ms", "tokens_per_second", "steps_per_profile"}
    assert stats["draft_tokens"] == 8 * stats["steps"] and plain_rows[0]["stats"]["draft_tokens"] == 0
    backed_off = _run(engine, "--prompts", prompts_file, "--max-tokens", 24, "--json")
    rows = [json.loads(line) for line in backed_off.output.splitlines()]
    assert [r["output_ids"] for r in rows] == [r["output_ids"] for r in plain_rows]  # backed off: still plain
    # an 8-node tree runs in the 9-slot profile every step; plain decoding in the one-slot step
    assert stats["steps_per_profile"] == {"9": stats["steps"]}
    assert plain_rows[0]["stats"]["steps_per_profile"] == {"1": plain_rows[0]["stats"]["steps"]}
    spinning = _run(engine, "--prompts", prompts_file, "--max-tokens", 24, "--json", "--spin")
    assert [json.loads(line)["output_ids"] for line in spinning.output.splitlines()] == \
        [r["output_ids"] for r in spec_rows]


@pytest.mark.parametrize("stream", [(), ("--stream",)])
def test_several_replies_are_separated_and_each_has_its_stats_line(engine, prompts_file, stream):
    result = _run(engine, "--prompts", prompts_file, "--max-tokens", 6, *stream)
    assert result.exit_code == 0, result.output
    replies = result.stdout.rstrip("\n").split("\n\n")
    assert len(replies) == 10 and all(r.strip() for r in replies)
    stats = result.stderr.splitlines()
    assert len(stats) == 10 and all(line.startswith("[6 tokens in ") for line in stats)


@pytest.mark.parametrize("args,message", [
    (["--prompt", "hello"], "has no tokenizer; pass token ids or rebuild with --tokenizer DIR"),
    (["--prompts", "{prompts}", "--max-tokens", "120"], "exceed the engine's max_seq_len 128"),
    (["--prompts", "{bad}"], "bad.jsonl:2: unknown key(s) text; valid keys: id, category, prompt, messages, input_ids"),
    (["--prompts", "{unknown}"], "unknown.jsonl:1: unknown key(s) output_ids; valid keys: id, category, prompt, "),
])
def test_errors_are_one_line(engine, prompts_file, tmp_path, args, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_ids": [1, 2]}\n{"text": "x"}\n')
    unknown = tmp_path / "unknown.jsonl"  # generate --json output is not a prompt file
    unknown.write_text('{"input_ids": [1, 2], "output_ids": [3]}\n')
    res = _run(engine, *[a.format(prompts=prompts_file, bad=bad, unknown=unknown) for a in args])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and message in res.output, res.output


def test_missing_or_corrupt_engine_files(engine, tmp_path, prompts_file):
    res = _run(tmp_path, "--prompts", prompts_file)
    assert res.exit_code == 1 and "no manifest.json; not an engine directory" in res.output
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in engine.iterdir():
        if f.is_file():
            (broken / f.name).write_bytes(f.read_bytes())
    (broken / "generation.onnx").write_bytes(b"garbage")
    res = _run(broken, "--prompts", prompts_file)
    size = (engine / "generation.onnx").stat().st_size
    assert res.exit_code == 1 and f"generation.onnx: 7 bytes, the manifest says {size}" in res.output, res.output
    manifest = json.loads((broken / "manifest.json").read_text())
    manifest["checksums"]["generation.onnx"]["size"] = 7  # a size as recorded (only hashes tell): ONNX Runtime finds it
    (broken / "manifest.json").write_text(json.dumps(manifest))
    res = _run(broken, "--prompts", prompts_file)
    assert res.exit_code == 1 and "generation.onnx: ONNX Runtime cannot load it" in res.output, res.output
    (broken / "medusa.onnx").unlink()
    res = _run(broken, "--prompts", prompts_file)
    assert res.exit_code == 1 and "file medusa.onnx (medusa) is missing from the engine directory" in res.output


def test_a_two_turn_prompt_set_is_refused_with_where_it_runs(engine):
    result = _run(engine, "--prompt-set", "mt-bench-2turn")
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert "--prompt-set mt-bench-2turn: its second turns need the engine's own first answers" in result.output
    assert "trtspec bench ENGINE --sets mt-bench-2turn" in result.output and "Traceback" not in result.output


def test_prompt_file_forms_give_the_same_tokens_as_the_library(engine, tmp_path):
    """generate --prompts reads token ids and chat lines with the one prompt reader; replies in prompt order."""
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    path = tmp_path / "p.jsonl"
    path.write_text('{"input_ids": [3, 4, 5]}\n{"id": "b", "input_ids": [9, 8]}\n')
    result = _run(engine, "--prompts", path, "--max-tokens", 5, "--json", "--stream")
    rows = [json.loads(line) for line in result.output.splitlines()]
    expected = LocalGenerator(engine).generate_many([[3, 4, 5], [9, 8]], GenerationConfig(max_tokens=5))
    assert [r["prompt_index"] for r in rows] == [0, 1]
    assert [r["output_ids"] for r in rows] == [g.output_ids for g in expected]


@pytest.fixture(scope="module")
def eagle_engines(tmp_path_factory):
    """One EAGLE checkpoint built twice: EAGLE-1's static tree and EAGLE-2's dynamic one (--eagle2 3,2,6)."""
    from trtspec.speculative.tree import DynamicTree

    root = tmp_path_factory.mktemp("gen-eagle")
    ckpt = tiny_trtllm_checkpoints(root, MODEL, ("eagle",))["eagle"]
    common = dict(max_input_len=64, max_seq_len=128, max_batch_size=2)
    build(BuildOptions(source=ckpt, out=root / "eagle1", **common))
    build(BuildOptions(source=ckpt, out=root / "eagle2", dynamic_tree=DynamicTree.parse("3,2,6"), **common))
    return ckpt, root / "eagle1", root / "eagle2"


def test_a_method_the_engine_was_not_built_for_says_what_to_rebuild(eagle_engines, prompts_file):
    ckpt, eagle, eagle2 = eagle_engines
    res = _run(eagle, "--prompts", prompts_file, "--max-tokens", 4, "--method", "eagle2")
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "Traceback" not in res.output, res.output
    assert "method eagle2 drafts EAGLE-2's dynamic tree and this engine was built with a static (EAGLE-1) tree: " \
           f"use --method eagle, or rebuild it with `trtspec build {ckpt} --out DIR --eagle2 " \
           "DEPTH,TOP_K,TOTAL_TOKENS` (TOTAL_TOKENS at most its max_draft_len 8)" in res.output
    res = _run(eagle2, "--prompts", prompts_file, "--max-tokens", 4, "--method", "eagle")
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert "this engine was built for EAGLE-2's dynamic tree (--eagle2): use --method eagle2" in res.output
    assert _run(eagle2, "--prompts", prompts_file, "--max-tokens", 4, "--method", "eagle2").exit_code == 0


def test_the_drafter_session_line_only_where_a_drafter_runs(eagle_engines, prompts_file, caplog, monkeypatch):
    """An engine with a drafter graph: the "drafter runs in its own session" line (and spinning off) only where the
    run uses that drafter; --method none / ngram and --no-spec run as a plain engine does."""
    monkeypatch.setenv("TRTSPEC_ORT_SPIN", "1")  # spinning on, as on a dedicated machine, where the line applies
    _, eagle, _ = eagle_engines
    for args, logged in ((("--method", "none"), False), (("--no-spec",), False), (("--method", "ngram"), False),
                         ((), True), (("--method", "hybrid"), True)):
        caplog.clear()
        with caplog.at_level("INFO"):
            res = _run(eagle, "--prompts", prompts_file, "--max-tokens", 2, *args)
        assert res.exit_code == 0, res.output
        assert any("drafter runs in its own ONNX Runtime session" in r.getMessage() for r in caplog.records) \
            == logged, args


@pytest.mark.parametrize("args,message", [
    (["--prompt-set", "{csv}"], "prompt set {csv}: a prompt file must be JSONL, named *.jsonl: one "),
    (["--prompt-set", "prompts.txt"], "prompt set prompts.txt: a prompt file must be JSONL"),
    (["--prompts", "{csv}"], "p.csv:1: not valid JSON (Expecting value at column 1); a prompt file must be JSONL"),
    (["--prompts", "{cut}"], "cut.jsonl:2: not valid JSON (Expecting ',' delimiter at column 19: the line ends "
                             "there, cut off?)"),
    (["--prompts", "{cut_string}"], "cut2.jsonl:1: not valid JSON (Unterminated string starting at column 12; "
                                    "the line ends at column 15: cut off?)"),
])
def test_a_prompt_file_that_is_not_jsonl_is_one_line(engine, tmp_path, args, message):
    csv = tmp_path / "p.csv"
    csv.write_text("prompt,category\nhello,chat\n")
    cut = tmp_path / "cut.jsonl"  # a file cut off mid-line: json names "line 2 column 1", past the line's end
    cut.write_text('{"prompt": "a"}\n{"prompt": "hello"\n')
    cut_string = tmp_path / "cut2.jsonl"
    cut_string.write_text('{"prompt": "hel')
    paths = {"csv": csv, "cut": cut, "cut_string": cut_string}
    res = _run(engine, *[a.format(**paths) for a in args])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "Traceback" not in res.output, res.output
    assert message.format(**paths) in res.output, res.output


def test_inspect_shows_the_manifest_with_the_bad_files_flagged(engine, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(engine, broken)
    (broken / "generation.onnx").write_bytes(b"garbage")
    (broken / "medusa.onnx").unlink()
    res = CliRunner().invoke(cli, ["inspect", str(broken)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"{broken}: onnx engine · medusa"  # the manifest, as for a good engine
    assert any(line.split() == ["max_draft_len", "8"] for line in lines)
    [problems] = [line for line in lines if line.lstrip().startswith("problems ")]
    size = (engine / "generation.onnx").stat().st_size
    assert f"generation.onnx: 7 bytes, the manifest says {size} (truncated or replaced after the build)" in problems
    assert "medusa.onnx: missing (the manifest's medusa file)" in problems
    facts = json.loads(CliRunner().invoke(cli, ["inspect", str(broken), "--json"]).output)
    assert "medusa.onnx" not in facts["files"] and facts["files"]["generation.onnx"] == 7
    assert "problems" not in json.loads(CliRunner().invoke(cli, ["inspect", str(engine), "--json"]).output)


class _Replies:
    """generate_remote's stand-in: records the url and hands back one reply per prompt, streamed or not."""

    def __init__(self):
        self.urls = []

    def __call__(self, url, prompts, config, *, stream, **kwargs):
        from trtspec.triton.client import RemoteGeneration, TritonClient

        self.urls.append(url)
        for i, _ in enumerate(prompts):
            reply = RemoteGeneration(i, output_ids=[1, 2, 3], text="abc", finish_reason="length", ttft_s=0.25)
            yield TritonClient._finished(reply, __import__("time").perf_counter() - 0.5, stream=stream)


def test_url_replies_name_ttft_only_when_streamed(monkeypatch):
    """--no-stream: the reply comes in one response, so its stats line gives the whole reply's latency, not a TTFT."""
    from trtspec.triton import client

    monkeypatch.setattr(client, "generate_remote", _Replies())
    streamed = CliRunner().invoke(cli, ["generate", "--url", "h:1", "--prompt", "hi"])
    assert streamed.exit_code == 0 and "TTFT 250 ms" in streamed.stderr, streamed.output
    whole = CliRunner().invoke(cli, ["generate", "--url", "h:1", "--prompt", "hi", "--no-stream"])
    assert whole.exit_code == 0 and "TTFT" not in whole.stderr, whole.output
    assert re.search(r"whole-reply latency \d+ ms, finish length\]$", whole.stderr.strip())
    record = json.loads(CliRunner().invoke(cli, ["generate", "--url", "h:1", "--prompt", "hi", "--no-stream",
                                                 "--json"]).stdout)
    assert record["stats"]["ttft_ms"] is None and record["stats"]["latency_ms"] >= 500


def test_url_without_a_port_uses_serves_grpc_port():
    """--url HOST: `trtspec serve`'s default gRPC port; the error (nothing there, or no such model) names it."""
    res = CliRunner().invoke(cli, ["generate", "--url", "127.0.0.1", "--prompt", "hi", "--model", "no-such-model"])
    assert res.exit_code == 1 and res.output.count("\n") == 1 and "Traceback" not in res.output, res.output
    assert "127.0.0.1:8001" in res.output
