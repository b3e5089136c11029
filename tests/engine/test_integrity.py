"""Engines that cannot be silently broken: sizes checked on open, content hashes by `verify`, `deploy` and `serve`."""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.integrity import content_hash
from trtspec.engine.manifest import MANIFEST_FILE
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import BuildError, ServerError
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer
from trtspec.triton.deploy import deploy
from trtspec.triton.deploy_options import DeployOptions
from trtspec.triton.server import verify_engines


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("eagle",))["eagle"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=32, max_seq_len=96,
                       tokenizer=root / "tokenizer"))
    return root / "engine"


@pytest.fixture
def engine(built, tmp_path):
    copy = tmp_path / "engine"
    shutil.copytree(built, copy)
    return copy


def test_the_manifest_records_every_file_of_the_engine(built):
    checksums = json.loads((built / MANIFEST_FILE).read_text())["checksums"]
    on_disk = {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()} - {MANIFEST_FILE}
    on_disk = {p for p in on_disk if not p.startswith("verify_curve")}
    assert set(checksums) == on_disk  # graphs, weights, the EAGLE draft's weights, the tokenizer's files
    assert {"weights.bin", "draft_weights.bin", "context.onnx"} <= set(checksums)
    for rel, record in checksums.items():
        assert record == {"size": (built / rel).stat().st_size, "blake2b": content_hash(built / rel)}


@pytest.mark.parametrize("name", ["weights.bin", "draft_weights.bin"])
def test_a_truncated_file_is_one_line_before_onnx_runtime_reads_it(engine, name):
    path = engine / name
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(size // 3)
    with pytest.raises(BuildError) as e:
        OrtEngine(engine, threads=1)
    assert str(e.value) == (f"{path}: {size // 3} bytes, the manifest says {size} (truncated or replaced after the "
                            "build); rebuild the engine")
    result = CliRunner().invoke(cli, ["generate", str(engine), "--prompt", "hi", "--max-tokens", "2"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [f"error: {e.value}"]  # one line; nothing from ONNX Runtime


def test_verify_deploy_and_serve_catch_a_changed_byte(engine, tmp_path):
    ok = CliRunner().invoke(cli, ["verify", str(engine), "--quiet"])
    assert ok.exit_code == 0 and "every size and content hash as built" in ok.stdout
    repo = deploy(DeployOptions(engine_dir=engine, out=tmp_path / "repo"))
    assert verify_engines(repo) == [engine.resolve()]
    path = engine / "weights.bin"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the hash can tell
    path.write_bytes(bytes(data))
    OrtEngine(engine, threads=1)  # opening checks sizes only
    bad = CliRunner().invoke(cli, ["verify", str(engine), "--quiet"])
    assert bad.exit_code == 1
    [line] = bad.stderr.strip().splitlines()
    assert line.startswith(f"error: {path}: content hash ") and line.endswith(
        "(the file changed after the build); rebuild the engine")
    with pytest.raises(BuildError, match="content hash"):
        deploy(DeployOptions(engine_dir=engine, out=tmp_path / "repo2"))
    assert not (tmp_path / "repo2").exists()
    with pytest.raises(ServerError, match=r"^tensorrt_llm: engine_dir .*weights.bin: content hash "):
        verify_engines(repo)  # what `trtspec serve` runs before it starts tritonserver
