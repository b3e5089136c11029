"""`trtspec train medusa|eagle|redrafter` on a tiny model: loss goes down, exports go through convert → build → generate
losslessly and beat untrained drafters, runs resume and repeat exactly, bad inputs give one-line errors."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from trtspec.checkpoint.convert import ConvertOptions, convert
from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.errors import ConfigError
from trtspec.runtime.generator import LocalGenerator
from trtspec.speculative.loop import GenerationConfig
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base, write_redrafter_drafter
from trtspec.train.init_heads import write_initial_medusa_heads
from trtspec.train.run import TrainOptions, train

MODEL = TinyModel(vocab_size=64)
SAMPLES, EVAL = 24, 4
FAST = dict(samples=SAMPLES, eval_samples=EVAL, max_new_tokens=32, max_prompt_tokens=16, heads=3, batch_size=32,
            show_progress=False)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny base, token-id prompts, and the self-distillation data every test shares (generated once)."""
    root = tmp_path_factory.mktemp("train")
    base = write_hf_base(root / "base", MODEL)
    rng = random.Random(0)
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"input_ids": [rng.randrange(3, 64) for _ in range(rng.randrange(4, 12))]})
                               + "\n" for _ in range(40)))
    data = root / "data"
    train(TrainOptions(method="medusa", base=base, out=root / "warmup", prompts=str(prompts), data=data, epochs=1,
                       **FAST))
    return {"root": root, "base": base, "prompts": prompts, "data": data}


def run(setup, tmp_path, method, name="out", **kwargs):
    opts = {**FAST, "epochs": 3, "data": setup["data"], **kwargs}
    return train(TrainOptions(method=method, base=setup["base"], out=tmp_path / name, prompts=str(setup["prompts"]),
                              **opts))


@pytest.mark.parametrize("method", ["medusa", "eagle", "redrafter"])
def test_loss_decreases_and_report_is_written(setup, tmp_path, method):
    result = run(setup, tmp_path, method)
    losses = result.report["training"]["epoch_losses"]
    assert len(losses) == 3 and losses[0] > losses[1] > losses[2], losses
    report = json.loads((tmp_path / "out" / "training.json").read_text())
    rows = report["accuracy"]["heads" if method == "medusa" else "depths"]
    assert len(rows) == (3 if method == "medusa" else 4)
    assert all(len(r["accuracy_at"]) == 10 and r["accuracy_at"] == sorted(r["accuracy_at"]) for r in rows)
    assert report["data"]["train_sequences"] == SAMPLES and report["data"]["held_out_sequences"] == EVAL
    files = {"medusa": {"medusa_lm_head.safetensors", "config.json", "training.json"},
             "eagle": {"model.safetensors", "config.json", "training.json"},
             "redrafter": {"model.safetensors", "config.json", "training.json"}}[method]
    assert {p.name for p in (tmp_path / "out").iterdir()} == files


def acceptance_length(setup, drafter: Path, method: str, root: Path) -> float:
    """τ of `drafter` on the held-out prompts through convert → build → generate, checked lossless."""
    beams = {"redrafter_num_beams": 2, "redrafter_draft_len_per_beam": 3} if method == "redrafter" else {}
    convert(ConvertOptions(base=setup["base"], out=root / "ckpt", **{method: drafter}, **beams), show_progress=False)
    build(BuildOptions(source=root / "ckpt", out=root / "engine", max_input_len=16, max_seq_len=64,
                       **({} if method == "redrafter" else {"preset": "chain_3"})))
    generator = LocalGenerator(root / "engine")
    prompts = [json.loads(line)["input_ids"] for line in setup["prompts"].read_text().splitlines()][SAMPLES:]
    spec = generator.generate_many(prompts, GenerationConfig(max_tokens=32, backoff=False))  # the drafter's own τ
    plain = generator.generate_many(prompts, GenerationConfig(max_tokens=32, no_spec=True))
    assert [g.output_ids for g in spec] == [g.output_ids for g in plain]  # lossless at temperature 0
    steps = sum(g.result.stats.steps for g in spec)
    return 1 + sum(g.result.stats.accepted_tokens for g in spec) / steps


@pytest.mark.parametrize("method", ["medusa", "eagle", "redrafter"])
def test_trained_drafter_converts_builds_and_beats_untrained(setup, tmp_path, method):
    # the tiny random base's replies are chaotic at first and then loop: learnable, but only with many steps
    trained = run(setup, tmp_path, method, **({"epochs": 40, "lr": 3e-3, "batch_size": 16} if method == "medusa"
                                              else {"epochs": 6})).out
    if method == "medusa":
        untrained = write_initial_medusa_heads(setup["base"], tmp_path / "untrained", num_heads=3)
    elif method == "redrafter":
        untrained = write_redrafter_drafter(tmp_path / "untrained", MODEL, num_draft_layers=1)
    else:
        untrained = write_eagle_draft(tmp_path / "untrained", MODEL, embed_tokens=False)
    tau_trained = acceptance_length(setup, trained, method, tmp_path / "a")
    tau_untrained = acceptance_length(setup, untrained, method, tmp_path / "b")
    assert tau_trained > tau_untrained + 0.1, (tau_trained, tau_untrained)


@pytest.mark.parametrize("method", ["medusa", "eagle", "redrafter"])
def test_resumed_run_equals_uninterrupted_run(setup, tmp_path, method):
    whole = run(setup, tmp_path, method, name="whole", epochs=2)
    stopped = run(setup, tmp_path, method, name="split", epochs=2, stop_after_steps=3)
    assert stopped.report == {"stopped_after_steps": 3} and not (tmp_path / "split").exists()
    with pytest.raises(ConfigError, match="pass --resume to continue it or --force to start over"):
        run(setup, tmp_path, method, name="split", epochs=2)
    resumed = run(setup, tmp_path, method, name="split", epochs=2, resume=True)
    weights = "medusa_lm_head.safetensors" if method == "medusa" else "model.safetensors"
    assert (tmp_path / "whole" / weights).read_bytes() == (tmp_path / "split" / weights).read_bytes()
    assert resumed.report["accuracy"] == whole.report["accuracy"]
    assert resumed.report["training"]["epoch_losses"] == whole.report["training"]["epoch_losses"]


def test_same_seed_same_bytes_other_seed_other_bytes(setup, tmp_path):
    files = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        run(setup, tmp_path, "eagle", name=name, epochs=1, seed=seed)
        files.append((tmp_path / name / "model.safetensors").read_bytes())
    assert files[0] == files[1] and files[0] != files[2]


def test_exported_layouts(setup, tmp_path):
    from safetensors import safe_open

    run(setup, tmp_path, "medusa", name="m", epochs=1)
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["medusa_num_heads"], config["medusa_num_layers"], config["version"]) == (3, 1, "2")
    with safe_open(tmp_path / "m" / "medusa_lm_head.safetensors", "pt") as f:
        assert sorted(f.keys()) == sorted(f"{h}.0.linear.{k}" for h in range(3) for k in ("weight", "bias"))
        assert str(f.get_tensor("0.0.linear.weight").dtype) == "torch.float16"
    run(setup, tmp_path, "eagle", name="e", epochs=1, with_embeddings=True, save_dtype="float32")
    config = json.loads((tmp_path / "e" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["bias"], config["hidden_size"]) == (1, True, MODEL.hidden_size)
    with safe_open(tmp_path / "e" / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"fc.weight", "fc.bias", "embed_tokens.weight", "layers.0.self_attn.q_proj.weight",
            "layers.0.mlp.down_proj.weight", "layers.0.post_attention_layernorm.weight"} <= keys
    assert not any("input_layernorm" in k or "lm_head" in k for k in keys)


def test_data_cache_cuts_a_torn_tail_and_is_reused(setup, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(setup["data"], data)
    with open(data / "features.f16", "ab") as f:  # a run killed in the middle of writing a sequence
        f.write(b"\0" * 1000)
    result = run(setup, tmp_path, "medusa", epochs=1, data=data)
    assert result.report["data"]["bytes"] == sum((setup["data"] / n).stat().st_size
                                                 for n in ("tokens.i32", "features.f16"))


def test_data_cache_grows_and_shrinks_with_the_sample_counts(setup, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(setup["data"], data)
    grown = run(setup, tmp_path, "medusa", name="grown", epochs=1, data=data, samples=SAMPLES + 4)
    assert grown.report["data"]["train_sequences"] == SAMPLES + 4
    assert len((data / "index.jsonl").read_text().splitlines()) == SAMPLES + 4 + EVAL  # 4 new sequences only
    size = grown.report["data"]["bytes"]
    shrunk = run(setup, tmp_path, "medusa", name="shrunk", epochs=1, data=data, samples=SAMPLES - 4, eval_samples=2)
    assert (shrunk.report["data"]["train_sequences"], shrunk.report["data"]["held_out_sequences"]) == (SAMPLES - 4, 2)
    assert shrunk.report["data"]["bytes"] == size  # nothing generated


def cli_args(setup, tmp_path, *extra):
    return ["train", "eagle", "--base", str(setup["base"]), "--out", str(tmp_path / "o"), "--prompts",
            str(setup["prompts"]), "--samples", str(SAMPLES), "--eval-samples", str(EVAL), "--max-new-tokens", "32",
            "--max-prompt-tokens", "16", "--epochs", "1", "--data", str(setup["data"]), *extra]


def test_cli_prints_accuracy_per_depth(setup, tmp_path):
    res = CliRunner().invoke(cli, cli_args(setup, tmp_path))
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"wrote {tmp_path / 'o'}: eagle drafter, ")
    assert [line.split(":")[0] for line in lines[1:]] == [f"  depth {d}" for d in (1, 2, 3, 4)]
    args = cli_args(setup, tmp_path / "r")
    args[1] = "redrafter"
    refused = CliRunner().invoke(cli, [*args, "--exit-dim", "48"])
    assert refused.exit_code == 1 and refused.stderr.strip() == (
        "error: --exit-dim 48 is below the base's hidden size 64: the drafter's lm_head starts as the base's over the "
        "first hidden columns")
    res = CliRunner().invoke(cli, [*args, "--draft-len", "3", "--no-rnn", "--exit-dim", "96"])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"wrote {tmp_path / 'r' / 'o'}: redrafter drafter, ")
    assert [line.split(":")[0] for line in lines[1:]] == [f"  depth {d}" for d in (1, 2, 3)]
    config = json.loads((tmp_path / "r" / "o" / "config.json").read_text())
    assert (config["rnn"], config["exit_dim"], config["model_type"]) == (False, 96, "recurrent_drafting_drafter")


@pytest.mark.parametrize("extra,message", [
    (["--prompts", "mt-bench"], "--prompts mt-bench is an evaluation set"),
    (["--prompts", "humaneval"], "--prompts humaneval is an evaluation set"),
    (["--prompts", "wikipedia"], "unknown prompt set 'wikipedia'; train on sharegpt, champ or a .jsonl file"),
    (["--prompts", "missing.jsonl"], "prompt file missing.jsonl does not exist"),
    (["--prompts", "prompts.csv"], "--prompts prompts.csv: a prompt file must be JSONL, named *.jsonl: one "),
    (["--samples", "0"], "--samples must be >= 1, got 0"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
    (["--lr", "-1"], "--lr must be > 0, got -1.0"),
    (["--unroll", "0"], "--unroll must be >= 1, got 0"),
    (["--resume", "--force"], "--resume continues the run in the work folder and --force starts over; pass one"),
    (["--resume"], "--resume: no checkpoint at"),
    (["--max-new-tokens", "8"], "holds data generated with other settings"),
])
def test_bad_inputs_give_one_line_errors(setup, tmp_path, extra, message):
    res = CliRunner().invoke(cli, cli_args(setup, tmp_path, *extra))
    assert res.exit_code == 1, res.output
    assert res.stderr.startswith("error: ") and message in res.stderr and len(res.stderr.splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_too_few_short_prompts_is_an_error(setup, tmp_path):
    with pytest.raises(ConfigError, match=r"has only \d+ prompts of at most 4 tokens \(--max-prompt-tokens\)"):
        run(setup, tmp_path, "medusa", data=tmp_path / "d", max_prompt_tokens=4)


def test_unrolled_depths_read_own_features_and_predict_further_ahead(setup, tmp_path):
    """Depth d of the training-time test: entry i reads token ids[i + d] and the draft's own depth d − 1 hidden,
    and is trained towards feature i + d and token ids[i + d + 1]; --unroll is recorded and trains."""
    import numpy as np
    import torch

    from trtspec.train import eagle as E
    from trtspec.train.data import Sample
    from trtspec.train.heads import SharedLmHead

    n, hidden = 12, MODEL.hidden_size
    ids = np.arange(3, 3 + n + 1)
    features = np.repeat(np.arange(n, dtype=np.float16)[:, None], hidden, axis=1)  # row i holds i
    b = E.sequence(Sample(ids, features, prompt_len=3))
    from trtspec.checkpoint.hf_config import read_base_config

    cfg = E.draft_config(read_base_config(setup["base"]))
    model = E.EagleDraftModule(cfg, torch.randn(MODEL.vocab_size, hidden), SharedLmHead(torch.randn(MODEL.vocab_size,
                                                                                                  hidden)))
    seen = []
    for d, (h, labels, targets) in enumerate(E.depth_outputs(model, b, b.features.float(), 3), start=1):
        rows = len(b.tokens) - (d - 1)
        assert h.shape == (rows, hidden) and targets.shape == (rows, hidden)
        assert torch.equal(targets[:, 0], torch.arange(d, d + rows, dtype=torch.float16))  # feature i + d
        valid = labels != -100
        assert torch.equal(labels[valid], torch.from_numpy(ids[d + 1:d + 1 + rows])[valid])  # token ids[i + d + 1]
        assert not valid[:1].any() and valid[-1]  # prompt entries are not trained
        seen.append(d)
    assert seen == [1, 2, 3]
    result = run(setup, tmp_path, "eagle", epochs=2, unroll=3)
    assert result.report["command_options"]["unroll"] == 3
    losses = result.report["training"]["epoch_losses"]
    assert losses[0] > losses[1], losses


def test_draft_vocabulary_is_exported_and_converts(setup, tmp_path):
    """--draft-vocab N: the N label ids used most, as EAGLE-3's d2t / t2d in model.safetensors; held-out
    accuracy is measured over it (a label outside it is never hit), and convert carries it."""
    import torch
    from safetensors.torch import load_file

    from trtspec.checkpoint.draft_vocab import read_checkpoint_vocab

    result = run(setup, tmp_path, "eagle", name="reduced", epochs=1, draft_vocab=12)
    report = result.report["accuracy"]
    assert report["draft_vocab"]["size"] == 12 and 0 < report["draft_vocab"]["held_out_coverage"] < 1
    assert report["depths"][0]["top10"] <= report["draft_vocab"]["held_out_coverage"]
    tensors = load_file(str(result.out / "model.safetensors"))
    target = torch.arange(12) + tensors["d2t"]
    assert int(tensors["t2d"].sum()) == 12 and bool(tensors["t2d"][target].all())
    ckpt = tmp_path / "ckpt"
    convert(ConvertOptions(base=setup["base"], out=ckpt, eagle=result.out), show_progress=False)
    assert list(read_checkpoint_vocab(ckpt, MODEL.vocab_size).target_ids) == target.tolist()

