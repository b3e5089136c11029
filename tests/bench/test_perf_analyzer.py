"""perf_analyzer against the served ensemble: its input file, command and CSV (fast), and a real run against a
tiny engine behind a real tritonserver (slow; skipped where no perf_analyzer binary is installed)."""

from __future__ import annotations

import json
import subprocess

import pytest
from click.testing import CliRunner

from trtspec.bench.perf_analyzer import command, find_binary, input_data, read_csv
from trtspec.cli import cli


def test_input_data_carries_trtspec_inputs_only_when_asked():
    plain = input_data(["hi", "there"], 16)
    assert [r["text_input"]["content"] for r in plain["data"]] == [["hi"], ["there"]]
    assert plain["data"][0]["max_tokens"] == {"content": [16], "shape": [1]}
    assert "draft_method" not in plain["data"][0] and "use_speculation" not in plain["data"][0]
    asked = input_data(["hi"], 8, method="ngram", speculation=False)["data"][0]
    assert asked["draft_method"]["content"] == ["ngram"] and asked["use_speculation"]["content"] == [False]


def test_command_streams_over_grpc(tmp_path):
    cmd = command("127.0.0.1:8001", tmp_path / "in.json", concurrency="1:4", requests=8, csv_file=tmp_path / "o.csv")
    assert cmd[:3] == ["perf_analyzer", "-m", "ensemble"] and "--streaming" in cmd
    assert cmd[cmd.index("--concurrency-range") + 1] == "1:4" and cmd[-2:] == ["-f", str(tmp_path / "o.csv")]


def test_read_csv_sorts_by_concurrency(tmp_path):
    path = tmp_path / "pa.csv"
    path.write_text("Concurrency,Inferences/Second,p50 latency\n2,40.1,44453\n1,40.5,23524\n")
    assert read_csv(path) == [{"Concurrency": 1.0, "Inferences/Second": 40.5, "p50 latency": 23524.0},
                              {"Concurrency": 2.0, "Inferences/Second": 40.1, "p50 latency": 44453.0}]


def test_perf_input_command_writes_the_file_and_prints_the_command(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("a b", "c d", "e f")))
    out = tmp_path / "in.json"
    result = CliRunner().invoke(cli, ["bench", "perf-input", "--prompt-set", str(prompts), "--limit", "2",
                                      "--max-tokens", "12", "--method", "ngram", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())["data"]
    assert [r["text_input"]["content"][0] for r in data] == ["a b", "c d"]
    assert result.stdout.startswith("perf_analyzer -m ensemble -u localhost:8001") and str(out) in result.stdout


@pytest.mark.slow
def test_perf_analyzer_measures_the_served_ensemble(tmp_path):
    binary = find_binary()
    if binary is None:
        pytest.skip("no perf_analyzer binary (PATH or $PERF_ANALYZER): it ships in tritonclient[all]<=2.40 wheels")
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer
    from trtspec.triton.deploy import DeployOptions, deploy
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    vocab = write_tiny_tokenizer(tmp_path / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(tmp_path, TinyModel(vocab_size=vocab), ("medusa",))["medusa"]
    build(BuildOptions(source=ckpt, out=tmp_path / "engine", max_input_len=64, max_seq_len=128, max_batch_size=4,
                       tokenizer=tmp_path / "tokenizer"))
    repo = deploy(DeployOptions(engine_dir=tmp_path / "engine", out=tmp_path / "repo", threads=1))
    (tmp_path / "in.json").write_text(json.dumps(input_data(["Hello world", "abc abc abc"], 16, method="ngram")))
    server = TritonServer(ServerOptions(repository=repo, grpc_port=free_port(), http_port=free_port(),
                                        metrics_port=free_port(), exit_timeout_s=5), on_log=lambda line: None)
    with server:
        done = subprocess.run(command(server.grpc_url, tmp_path / "in.json", concurrency="1:2", requests=8,
                                      csv_file=tmp_path / "pa.csv", binary=binary),
                              capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = read_csv(tmp_path / "pa.csv")
    assert [r["Concurrency"] for r in rows] == [1.0, 2.0]
    assert all(r["Inferences/Second"] > 0 and r["p50 latency"] > 0 for r in rows)
