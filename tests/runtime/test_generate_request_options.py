"""`trtspec generate` request options on a tiny engine with a tokenizer: --repetition-penalty / --presence-penalty /
--frequency-penalty (the same tokens as the library, speculation on or off), --stop, --logprobs, and bad values in
one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from trtspec.cli import cli
from trtspec.engine.onnx_builder import BuildOptions, build
from trtspec.runtime import LocalGenerator
from trtspec.speculative import GenerationConfig, Penalties
from trtspec.testing import TinyModel, tiny_trtllm_checkpoints, write_tiny_tokenizer

PROMPT = "Speculative decoding drafts tokens"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("options")
    vocab = write_tiny_tokenizer(root / "tokenizer")
    ckpt = tiny_trtllm_checkpoints(root, TinyModel(vocab_size=vocab), ("none",))["none"]
    build(BuildOptions(source=ckpt, out=root / "engine", max_input_len=64, max_seq_len=160, max_draft_len=8,
                       tokenizer=root / "tokenizer"))
    return root / "engine"


def _json(engine, *args) -> dict:
    result = CliRunner().invoke(cli, ["generate", str(engine), "--prompt", PROMPT, "--max-tokens", "40", "--json",
                                      *map(str, args)])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_penalties_give_the_librarys_tokens_with_and_without_speculation(engine):
    flags = ("--repetition-penalty", 1.4, "--presence-penalty", 0.5, "--frequency-penalty", 0.25)
    plain = _json(engine, "--no-spec", *flags)
    spec = _json(engine, "--method", "ngram", *flags)
    assert spec["output_ids"] == plain["output_ids"]
    expected = LocalGenerator(engine, threads=1).generate(PROMPT, GenerationConfig(
        max_tokens=40, no_spec=True, penalties=Penalties(repetition=1.4, presence=0.5, frequency=0.25)))
    assert plain["output_ids"] == expected.output_ids
    assert plain["output_ids"] != _json(engine, "--no-spec")["output_ids"]


def test_stop_ends_the_reply_after_the_stop_texts_tokens(engine):
    full = _json(engine, "--no-spec")
    generator = LocalGenerator(engine, threads=1)
    out = full["output_ids"]
    # two output tokens whose text tokenizes back to them
    ids = next(out[i:i + 2] for i in range(3, len(out) - 1)
               if generator.tokenizer.encode(generator.tokenizer.decode(out[i:i + 2])) == out[i:i + 2])
    word = generator.tokenizer.decode(ids)
    stopped = _json(engine, "--no-spec", "--stop", word)
    end = next(i + len(ids) for i in range(len(full["output_ids"]))
               if full["output_ids"][i:i + len(ids)] == ids)
    assert stopped["output_ids"] == full["output_ids"][:end]
    assert stopped["finish_reason"] == "stop_word"


def test_logprobs_are_reported_per_token(engine):
    record = _json(engine, "--no-spec", "--logprobs")
    assert len(record["log_probs"]) == len(record["output_ids"])
    assert all(v <= 0 for v in record["log_probs"])
    sampled = _json(engine, "--method", "ngram", "--logprobs", "--temperature", 0.8, "--seed", 3)
    assert len(sampled["log_probs"]) == len(sampled["output_ids"]) and all(np.isfinite(sampled["log_probs"]))
    assert "log_probs" not in _json(engine, "--no-spec")
    text = CliRunner().invoke(cli, ["generate", str(engine), "--prompt", PROMPT, "--max-tokens", "8", "--logprobs"])
    assert text.exit_code == 0 and "log p -" in text.output


@pytest.mark.parametrize("args,message", [
    (["--repetition-penalty", "0"], "error: repetition_penalty must be > 0 (1 is off), got 0.0"),
    (["--presence-penalty", "nan"], "error: presence_penalty must be a finite number, got nan"),
])
def test_bad_penalties_are_one_line(engine, args, message):
    result = CliRunner().invoke(cli, ["generate", str(engine), "--prompt", PROMPT, *args])
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [message]


def test_a_draft_budget_caps_the_training_free_drafters_and_keeps_the_output(engine):
    """LocalGenerator(draft_budget=N), what `deploy --draft-budget N` serves: ngram and lookahead draft at most N
    tokens a step on an engine with room for more, and decode what plain decoding does."""
    import re

    from trtspec.errors import ConfigError

    prompts = ["Hello world, this is a tiny tokenizer. Hello world, this is a tiny", PROMPT]
    whole = LocalGenerator(engine, threads=1)
    capped = LocalGenerator(engine, threads=1, draft_budget=2)
    plain = [whole.generate(p, GenerationConfig(max_tokens=40, no_spec=True)).output_ids for p in prompts]
    for method in ("ngram", "lookahead"):
        config = GenerationConfig(max_tokens=40, method=method, backoff=False)
        results = [capped.generate(p, config) for p in prompts]
        assert [r.output_ids for r in results] == plain
        slots = {int(k) for r in results for k in r.to_dict()["stats"]["steps_per_profile"]}
        assert slots and max(slots) <= 3, (method, slots)  # a 2-token draft and its root: the 3-slot profile
        assert sum(r.result.stats.draft_tokens for r in results) > 0
    wide = [whole.generate(p, GenerationConfig(max_tokens=40, method="lookahead", backoff=False)) for p in prompts]
    assert max(int(k) for r in wide for k in r.to_dict()["stats"]["steps_per_profile"]) > 3  # the cap did it
    with pytest.raises(ConfigError, match=re.escape("draft budget 9: the training-free drafters' tokens per step, "
                                                    "1 to the engine's max_draft_len 8")):
        LocalGenerator(engine, threads=1, draft_budget=9)
