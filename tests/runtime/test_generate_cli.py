"""`trtspec generate` on a tiny engine: JSON output, speculation on / off identical, clear errors."""

from __future__ import annotations

import json

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
