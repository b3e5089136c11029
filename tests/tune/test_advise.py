"""`trtspec advise`: the verdict and its reasons from a bench report and a verify curve, and the command on a tiny
engine (its verdict is whatever the tiny engine measures: only its shape is asserted)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from trtspec.tune.advise import GO_MARGIN, GO_TAU, decide, format_advice
from trtspec.cli import cli
from trtspec.speculative.step_costs import StepCosts

COSTS = StepCosts((1, 5, 9), (1.0, 1.1, 1.3), (20.0, 22.0, 26.0), 8, (4.0, 9.0, 14.0))


def _figures(*, tps: float, speedup: float | None, tau: float = 1.0, tokens: int = 512, draft_share: float = 0.02,
             ttft: float = 50.0, steps=None) -> dict:
    return {"requests": 4, "output_tokens": tokens, "output_tokens_per_s": tps, "speedup": speedup, "tau": tau,
            "acceptance_rate": (tau - 1) / 4, "identical": "4/4", "draft_share": draft_share,
            "ttft_ms": {"p50": ttft}, "steps_per_profile": steps or {"5": 10}}


def _report(concurrency: int, ngram: dict, temperature: float = 0.0) -> dict:
    results = {str(c): {"none": {"overall": _figures(tps=50.0, speedup=1.0)}, "ngram": {"overall": ngram}}
               for c in sorted({1, concurrency})}
    return {"target": "e", "prompt_set": "mt-bench", "prompts": 4, "temperature": temperature, "results": results}


def test_go_when_the_method_beats_plain():
    advice = decide(_report(1, _figures(tps=90.0, speedup=1.8, tau=2.4)), 1, COSTS)
    assert advice["verdict"] == "go" and advice["recommendation"]["method"] == "ngram"
    assert advice["recommendation"]["slot_profile"] == 5 and advice["recommendation"]["max_draft_len"] == 4
    reasons = {r["name"]: r for r in advice["reasons"]}
    assert reasons["acceptance"]["favours_speculation"] and "τ 2.40" in reasons["acceptance"]["text"]
    assert "1.10x a plain step for 1 sequence (" in reasons["concurrency"]["text"]  # concurrency 1: said once


@pytest.mark.parametrize("figures, concurrency, temperature, against", [
    (_figures(tps=51.0, speedup=1.02, tau=1.1), 1, 0.0, "acceptance"),
    (_figures(tps=53.0, speedup=1.06, tau=1.0), 1, 0.0, "acceptance"),  # faster without accepted drafts: noise
    (_figures(tps=40.0, speedup=0.8, tau=2.0, tokens=40), 1, 0.0, "output length"),
    (_figures(tps=40.0, speedup=0.8, tau=1.3), 1, 0.7, "temperature"),
    (_figures(tps=40.0, speedup=0.8, tau=2.0), 8, 0.0, "concurrency"),
    (_figures(tps=40.0, speedup=0.8, tau=2.0, draft_share=0.3), 1, 0.0, "drafting overhead"),
    (_figures(tps=40.0, speedup=0.8, tau=2.0, ttft=80.0), 1, 0.0, "ttft"),
])
def test_no_go_names_what_goes_against_it(figures, concurrency, temperature, against):
    advice = decide(_report(concurrency, figures, temperature), concurrency, COSTS)
    assert advice["verdict"] == "no-go" and advice["recommendation"]["method"] == "none"
    assert against in [r["name"] for r in advice["reasons"] if not r["favours_speculation"]]
    assert figures["speedup"] < GO_MARGIN or figures["tau"] < GO_TAU


def test_concurrency_reads_the_batch_curve():
    advice = decide(_report(8, _figures(tps=40.0, speedup=0.8, tau=2.0)), 8, COSTS)
    text = next(r["text"] for r in advice["reasons"] if r["name"] == "concurrency")
    assert f"{9.0 / 4.0:.2f}x for 8" in text  # 5 slots over 8 sequences ÷ 1 slot over 8


def test_advise_command_on_a_tiny_engine(tmp_path_factory):
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("advise")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("none",))["none"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=96, max_seq_len=160, max_batch_size=2,
                       tokenizer=root / "tokenizer", max_draft_len=4))
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("abc abc abc", "Hello world")))
    result = CliRunner().invoke(cli, ["advise", str(root / "engine"), "--prompt-set", str(prompts), "--concurrency",
                                      "2", "--max-tokens", "16", "--threads", "1", "--no-progress", "--json"])
    assert result.exit_code == 0, result.output
    advice = json.loads(result.stdout)
    assert advice["verdict"] in ("go", "no-go") and set(advice["speedups"]) == {"ngram", "suffix"}
    assert [r["name"] for r in advice["reasons"]] == ["acceptance", "output length", "temperature", "concurrency",
                                                     "drafting overhead", "ttft", "measured"]
    assert advice["bench"]["concurrency"] == [1, 2]
    text = CliRunner().invoke(cli, ["advise", str(root / "engine"), "--prompt-set", str(prompts), "--max-tokens", "8",
                                    "--threads", "1", "--no-progress"])
    assert text.exit_code == 0 and ("GO:" in text.stdout or "NO-GO:" in text.stdout), text.output
    assert "speedup per method at concurrency 1: " in text.stdout and "; at 1:" not in text.stdout  # said once
    assert "; at 1: " in "\n".join(format_advice(advice))  # at C = 2 both


# ---- advise --schedule ----------------------------------------------------------------------------------------

def _schedule(speedups, levels=None):
    from pathlib import Path

    from trtspec.tune.draft_schedule import ScheduleOptions, schedule_from

    return schedule_from(speedups, ScheduleOptions(engine=Path("e")), 8)


def test_the_schedule_takes_each_levels_best_length_under_upstreams_rules():
    """Each level drafts its fastest length, 0 where none beats plain by GO_MARGIN; batch size 1's length is
    max_draft_len and caps the rest; repeated lengths are one entry (a batch drafts the largest threshold <= its
    size); max_concurrency is the last level before speculation stops."""
    result = _schedule({1: {8: 1.40, 4: 1.30, 2: 1.10, 1: 1.05}, 2: {8: 1.20, 4: 1.25, 2: 1.10, 1: 1.02},
                        4: {8: 1.0, 4: 1.12, 2: 1.15, 1: 1.01}, 8: {8: 0.8, 4: 0.9, 2: 1.01, 1: 1.02}})
    assert result["verdict"] == "go"
    assert result["draft_len_schedule"] == {1: 8, 2: 4, 4: 2, 8: 0} and result["max_concurrency"] == 4
    assert result["deploy_flags"] == ["--ngram", "--max-draft-len", "8", "--draft-len-schedule", "1:8,2:4,4:2,8:0"]
    from trtspec.triton.deploy_options import check_draft_len_schedule, parse_draft_len_schedule

    check_draft_len_schedule(parse_draft_len_schedule(result["deploy_flags"][-1]), 8)  # what deploy accepts
    same = _schedule({1: {8: 1.1, 4: 1.3}, 2: {8: 1.1, 4: 1.3}, 4: {8: 1.2, 4: 1.25}})
    assert same["draft_len_schedule"] == {1: 4} and same["max_concurrency"] is None  # capped at batch size 1's
    assert _schedule({1: {8: 1.01, 4: 1.0}, 2: {8: 1.3, 4: 1.0}})["verdict"] == "no-go"
    noisy = _schedule({1: {8: 1.3, 4: 1.2}, 2: {8: 1.0, 4: 1.0}, 4: {8: 1.1, 4: 1.0}})  # never back on
    assert noisy["draft_len_schedule"] == {1: 8, 2: 0} and noisy["max_concurrency"] == 1


def test_advise_schedule_on_a_tiny_engine(tmp_path_factory):
    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

    root = tmp_path_factory.mktemp("schedule")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("none",))["none"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=96, max_seq_len=160, max_batch_size=2,
                       tokenizer=root / "tokenizer", no_spec=True, max_draft_len=4))
    prompts = root / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in ("abc abc abc abc", "Hello world")))
    args = ["advise", str(root / "engine"), "--schedule", "--prompt-set", str(prompts), "--max-tokens", "12",
            "--threads", "1", "--no-progress"]
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert found["levels"] == [1, 2] and set(found["speedups"]["2"]) == {"4", "2", "1"}
    assert found["verdict"] in ("go", "no-go") and "re-measure on the GPU host" in found["measured_on"]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "measured on this machine's CPU engine" in text.stdout, text.output
    for extra, message in ((["--method", "medusa"], "--schedule measures draft lengths through the draft budget"),
                           (["--levels", "1,4"], "--levels 4 exceeds the engine's max_batch_size 2"),
                           (["--concurrency", "2"], "drop --concurrency")):
        refused = CliRunner().invoke(cli, [*args, *extra])
        assert refused.exit_code != 0 and message in refused.output, refused.output
