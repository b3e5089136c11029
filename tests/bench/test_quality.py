"""`trtspec bench quality`: teacher-forced scoring through the engine's own steps, perplexity / agreement / greedy
divergence against a reference engine, the corpora's fixed slices, and the command."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.bench.quality import (SHAREGPT_START, QualityOptions, first_divergence, format_report, load_samples,
                                   log_softmax, measure_quality, teacher_forced_logits)
from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime.ort_engine import OrtEngine
from trtspec.runtime.tokenizer import Tokenizer
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints
from trtspec.testing.tokenizers import write_tiny_tokenizer


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """A tiny model with a real (tiny BPE) tokenizer as fp32, an fp32 twin, int8 and int4."""
    root = tmp_path_factory.mktemp("quality")
    vocab = write_tiny_tokenizer(root / "tok")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab, tie_word_embeddings=True), drafters=("none",))
    out = {}
    for name, weights in (("fp32", "fp32"), ("int8", "int8"), ("int4", "int4")):
        out[name] = root / name
        build(BuildOptions(source=ckpt["none"], out=out[name], max_input_len=384, max_seq_len=512, max_draft_len=4,
                           weights=weights, tokenizer=root / "tok"))
    out["twin"] = root / "twin"
    shutil.copytree(out["fp32"], out["twin"])
    return out


@pytest.mark.parametrize("name", ["fp32", "int4"])
def test_teacher_forced_logits_are_the_plain_decode_logits(engines, name):
    """Chunked chain verify steps (K + 1 = 5 tokens each) score every target token as a plain decode feeding one token
    at a time would (quantized: bit for bit, the path every step takes; fp32: to the last bits)."""
    engine = OrtEngine(engines[name], threads=1)
    rng = np.random.default_rng(0)
    context, target = rng.integers(0, engine.vocab_size, 9), rng.integers(0, engine.vocab_size, 13)
    scored = teacher_forced_logits(engine, context, target)
    seq = engine.open()
    rows = [engine.prefill(seq, context).logits[-1]]
    one = (np.zeros(1, np.int64), np.ones((1, 1), bool))
    for token in target[:-1]:
        rows.append(engine.verify(seq, np.array([token]), *one).logits[0])
        engine.commit(seq, (0,))
    engine.close(seq)
    assert scored.shape == (13, engine.vocab_size)
    if name == "int4":
        assert np.array_equal(scored, np.stack(rows))
    else:
        assert np.abs(scored - np.stack(rows)).max() < 1e-4
    assert engine.kv_rows[0] == 0  # the sequences were closed


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 5, 3], [1, 2, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2  # stopped early (an end token)
    assert first_divergence([1, 2, 3, 4], [1, 2, 3]) == 3


def test_quality_against_the_reference(engines):
    """An fp32 twin of the reference agrees everywhere (ratio 1, KL 0, every greedy decode identical); int4 and
    int8 are scored on the same tokens and depart somewhere."""
    options = QualityOptions(samples=4, max_target=24, max_context=384, greedy_prompts=2, greedy_tokens=12,
                             threads=1, corpora=("humaneval",))
    report = measure_quality([engines["twin"], engines["int8"], engines["int4"]], engines["fp32"], options,
                             progress=False)
    twin, int8, int4 = report.engines
    ref = report.reference.corpora["humaneval"]
    assert ref.samples == 4 and ref.tokens == sum(r.corpora["humaneval"].tokens for r in report.engines) / 3
    assert twin.corpora["humaneval"].agree == ref.tokens and twin.corpora["humaneval"].kl == pytest.approx(0, abs=1e-9)
    assert report.perplexity_ratio(twin, "humaneval") == 1.0
    assert twin.identical_greedy == 2 and twin.first_divergence == twin.greedy_lengths
    for row in (int8, int4):
        score = row.corpora["humaneval"]
        assert score.kl > 0 and 0 < score.agree <= score.tokens and np.isfinite(score.perplexity)
    assert int4.corpora["humaneval"].kl > int8.corpora["humaneval"].kl  # 4 bits move the distribution more
    assert int4.weights["linear"] == "int4 (block 32, accuracy level 4)"
    data = json.loads(json.dumps(report.to_dict()))
    assert data["slices"]["humaneval"].startswith("HumanEval canonical solutions") and "humaneval/0 .." in \
        data["slices"]["humaneval"]
    table = format_report(report)
    assert table[2].startswith("| fp32 | fp32 |") and "+0.0%" in table[3] and "int4" in table[5]


def test_log_softmax_and_perplexity_by_hand():
    logits = np.array([[0.0, np.log(3.0)]], np.float32)
    assert np.allclose(np.exp(log_softmax(logits)), [[0.25, 0.75]])


def test_sharegpt_slice_is_fixed_and_held_out(engines):
    tokenizer = Tokenizer.from_dir(engines["fp32"] / "tokenizer")
    options = QualityOptions(samples=3, max_target=16, max_context=4096, corpora=("sharegpt",))
    samples = load_samples(tokenizer, "sharegpt", options)
    assert [s.id for s in samples] == [s.id for s in load_samples(tokenizer, "sharegpt", options)]
    assert len(samples) == 3 and all(len(s.target) == 16 for s in samples)
    from trtspec.data.prompts import load_prompts

    early = {p.id for p in load_prompts("sharegpt", limit=SHAREGPT_START)}
    assert not early & {s.id for s in samples}  # none of the conversations training runs read first
    assert samples[0].context[-1] == tokenizer.encode("<|assistant|>")[-1]  # the chat template's generation prompt


def test_bench_quality_command(engines, tmp_path):
    result = CliRunner().invoke(cli, ["bench", "quality", str(engines["int4"]), "--reference", str(engines["fp32"]),
                                      "--corpus", "humaneval", "--samples", "2", "--max-target", "8",
                                      "--greedy-prompts", "1", "--greedy-tokens", "4", "--threads", "1",
                                      "--max-context", "384", "--out", str(tmp_path / "q")])
    assert result.exit_code == 0, result.output
    assert "| int4 | int4 b32 |" in result.output
    report = json.loads((tmp_path / "q" / "report.json").read_text())
    assert report["engines"][0]["corpora"]["humaneval"]["tokens"] == 16


def test_bench_quality_bad_input(engines, tmp_path):
    result = CliRunner().invoke(cli, ["bench", "quality", str(engines["int4"]), "--reference", str(engines["fp32"]),
                                      "--samples", "0"])
    assert result.exit_code == 2 and "--samples" in result.output
    other = tmp_path / "other"
    shutil.copytree(engines["int4"], other)
    manifest = json.loads((other / "manifest.json").read_text())
    manifest["model"]["vocab_size"] += 1
    (other / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="vocabulary of .* tokens; the reference .* compare engines of the same"):
        measure_quality([other], engines["fp32"], QualityOptions(samples=1, max_context=384, corpora=("humaneval",)),
                        progress=False)


@pytest.mark.slow
def test_smollm2_int8_stays_within_five_percent_of_fp32(tmp_path):
    """SmolLM2-135M-Instruct as fp32 and int8 (block 32) engines: int8's perplexity on 8 held-out ShareGPT replies and
    8 HumanEval solutions is within the issue's 5% of fp32's, and nearly every argmax agrees (README: 32 + 32 texts,
    +0.6% / +0.9%, 97.4%)."""
    from trtspec import ConvertOptions, convert
    from trtspec.hub.fetch import fetch_model

    convert(ConvertOptions(base=fetch_model("smollm2-135m"), out=tmp_path / "ckpt"), show_progress=False)
    for weights in ("fp32", "int8"):
        build(BuildOptions(source=tmp_path / "ckpt", out=tmp_path / weights, max_input_len=512, max_seq_len=640,
                           max_draft_len=16, weights=weights))
    report = measure_quality([tmp_path / "int8"], tmp_path / "fp32",
                             QualityOptions(samples=8, greedy_prompts=0, threads=2), progress=False)
    [int8] = report.engines
    for corpus in ("sharegpt", "humaneval"):
        assert 0.95 < report.perplexity_ratio(int8, corpus) < 1.05, corpus
    scores = int8.corpora.values()
    assert sum(s.agree for s in scores) / sum(s.tokens for s in scores) > 0.9
