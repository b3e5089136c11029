"""`trtspec bench perf-input`: a prompt set as perf_analyzer's input file and its command (the tool itself runs
against a real server in tests/triton/test_load_tools.py)."""

from __future__ import annotations

import json

from click.testing import CliRunner

from trtspec.bench.perf_analyzer import command, input_data
from trtspec.cli import cli


def test_input_data_carries_trtspec_inputs_only_when_asked():
    plain = input_data(["hi", "there"], 16)
    assert plain["data"] == [{"text_input": ["hi"], "max_tokens": [16], "stream": [True]},
                             {"text_input": ["there"], "max_tokens": [16], "stream": [True]}]
    asked = input_data(["hi"], 8, method="ngram", speculation=False)["data"][0]
    assert asked["draft_method"] == ["ngram"] and asked["use_speculation"] == [False]


def test_command_streams_over_grpc_and_warms_up_enough(tmp_path):
    cmd = command("127.0.0.1:8001", tmp_path / "in.json", concurrency="1:4", requests=8)
    assert cmd[:3] == [".venv-tools/bin/perf_analyzer", "-m", "ensemble"] and "--streaming" in cmd
    assert cmd[cmd.index("--concurrency-range") + 1] == "1:4"
    assert cmd[cmd.index("--warmup-request-count") + 1] == "4"


def test_perf_input_command_writes_the_file_and_prints_the_command(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("a b", "c d", "e f")))
    out = tmp_path / "in.json"
    result = CliRunner().invoke(cli, ["bench", "perf-input", "--prompt-set", str(prompts), "--limit", "2",
                                      "--max-tokens", "12", "--method", "ngram", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())["data"]
    assert [r["text_input"][0] for r in data] == ["a b", "c d"] and data[0]["draft_method"] == ["ngram"]
    assert result.stdout.startswith(".venv-tools/bin/perf_analyzer -m ensemble -i grpc -u localhost:8001")
