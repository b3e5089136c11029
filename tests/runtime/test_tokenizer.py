"""The serving-path tokenizer against transformers: a tiny trained BPE tokenizer, then the real SmolLM2 one."""

from __future__ import annotations

import json
import random

import pytest
from tokenizers import Tokenizer as BackendTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from trtspec.errors import CheckpointError, ConfigError
from trtspec.runtime.tokenizer import IncrementalDecoder, Tokenizer

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
# laid out on lines the way Hub templates are: renders to one line only with trim_blocks and lstrip_blocks
TINY_TEMPLATE = """{{ bos_token }}
{%- for m in messages %}
  {% if m['role'] not in ['system', 'user', 'assistant'] %}
    {{ raise_exception('unknown role ' + m['role']) }}
  {% endif %}
{{ '<|' + m['role'] + '|>' + m['content'] + '<|end|>' }}
{%- endfor %}
{% if add_generation_prompt %}
{{ '<|assistant|>' }}
{%- endif %}"""
TEXTS = [
    "Hello, world!",
    "",
    " leading and trailing spaces  ",
    "Tabs\tand\nnewlines\n\n\nand  runs   of    spaces",
    "Compose an engaging travel blog post about a recent trip to Hawaii.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Ünïcödé façade, naïve café, Straße, Ελληνικά, русский текст",
    "你好，世界！今天天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "مرحبا بالعالم",
    "emoji 👋🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 and 🤖",
    "math: ∑_{i=1}^{n} i² = n(n+1)(2n+1)/6, ∀x∈ℝ",
    "combining e\u0301 and zero\u200bwidth",
    "Numbers 1234567890 3.14159 -42 1e10",
    "Special tokens inline <|im_start|>user\nhi<|im_end|> and <|endoftext|>",
    "JSON: {\"key\": [1, 2, {\"nested\": null}]}",
    "URL https://example.com/path?q=1&r=2#frag",
    "A" * 300,
    "Mixed 😀text😀with😀emoji😀between",
    "The quick brown fox jumps over the lazy dog. " * 5,
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi 👋"}],
    [{"role": "user", "content": "Write a haiku."},
     {"role": "assistant", "content": "Autumn moonlight—\na worm digs"},
     {"role": "user", "content": "Now one in 日本語."}],
    [{"role": "user", "content": "Tokens <|im_end|> inside\ncontent"}],
]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """A byte-level BPE tokenizer trained on a few strings, with a BOS post-processor and a chat template."""
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    backend = BackendTokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(TEXTS * 3, trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", 1)])
    backend.save(str(out / "tokenizer.json"))
    eos = {"__type": "AddedToken", "content": "</s>", "special": True}  # the dict form is read too
    config = {"bos_token": "<s>", "eos_token": eos, "unk_token": "<unk>", "chat_template": TINY_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 6]}))
    return out


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return Tokenizer.from_dir(tiny_dir)


def test_tiny_round_trip_and_special_tokens(tiny):
    for text in TEXTS:
        assert tiny.decode(tiny.encode(text)) == text
    assert tiny.encode("hi", add_special_tokens=True) == [1, *tiny.encode("hi")]
    assert tiny.encode("<|user|>") == [3]  # special tokens in text are parsed, as transformers does
    assert tiny.decode([1, *tiny.encode("hi"), 2]) == "hi"
    assert tiny.decode([1, *tiny.encode("hi"), 2], skip_special_tokens=False) == "<s>hi</s>"
    assert tiny.eos_token_ids == (2, 6) and tiny.bos_token_id == 1


def test_tiny_chat_template(tiny):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert tiny.apply_chat_template(chat) == "<s><|system|>be brief<|end|><|user|>hi<|end|><|assistant|>"
    assert tiny.apply_chat_template(chat, add_generation_prompt=False).endswith("hi<|end|>")
    assert tiny.encode_chat(chat) == [1, 5, *tiny.encode("be brief"), 6, 3, *tiny.encode("hi"), 6, 4]


def test_tiny_matches_transformers(tiny_dir, tiny):
    transformers = pytest.importorskip("transformers")
    reference = transformers.AutoTokenizer.from_pretrained(tiny_dir)
    _assert_matches(tiny, reference)


def test_chat_template_file_and_named_templates(tiny_dir, tmp_path):
    for name in ("tokenizer.json", "generation_config.json"):
        (tmp_path / name).write_bytes((tiny_dir / name).read_bytes())
    named = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ messages[0]['content'] }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "c"}]) == "c"
    (tmp_path / "chat_template.jinja").write_text("[{{ messages | length }}]")  # the file takes priority
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "c"}]) == "[1]"


def test_template_sandbox_and_tojson(tiny_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((tiny_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": "{{ messages.append(1) }}"}))
    tok = Tokenizer.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="chat template failed"):  # the immutable sandbox refuses edits
        tok.apply_chat_template([{"role": "user", "content": "é<b>"}])
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0] | tojson }}"}))
    assert Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "é<b>"}]) == \
        '{"role": "user", "content": "é<b>"}'


@pytest.mark.parametrize("files, call, error, message", [
    ({}, None, CheckpointError, "has no tokenizer.json"),
    ({"tokenizer.json": "{not json"}, None, CheckpointError, "not a valid tokenizers file"),
    ({"tokenizer_config.json": "[1]"}, None, CheckpointError, "expected a JSON object, got list"),
    ({"tokenizer_config.json": "{"}, None, CheckpointError, "tokenizer_config.json: not valid JSON"),
    ({"tokenizer_config.json": json.dumps({"chat_template": [{"name": "tool_use", "template": "x"}]})}, None,
     CheckpointError, r"chat_template lists \['tool_use'\] but no 'default' template"),
    ({"tokenizer_config.json": "{}"}, "chat", ConfigError, "has no chat_template"),
    ({"tokenizer_config.json": json.dumps({"chat_template": "{% if %}"})}, "chat", CheckpointError,
     "chat_template does not parse"),
    ({}, "bad-role", ConfigError, "chat template failed on these messages: unknown role tool"),
])
def test_bad_folders(tiny_dir, tmp_path, files, call, error, message):
    if "tokenizer.json" not in files and files:
        files = {"tokenizer.json": (tiny_dir / "tokenizer.json").read_text(), **files}
    if call == "bad-role":
        files = {name: (tiny_dir / name).read_text() for name in ("tokenizer.json", "tokenizer_config.json")}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(error, match=message):
        tok = Tokenizer.from_dir(tmp_path)
        tok.apply_chat_template([{"role": "tool" if call == "bad-role" else "user", "content": "x"}])


def test_incremental_decoder_never_splits_a_character(tiny):
    text = "🦀ж€"  # not in the training strings: several byte-level ids per character
    ids = tiny.encode(text)
    assert len(ids) > len(text)
    decoder = IncrementalDecoder(tiny)
    pieces = [decoder.feed(i) for i in ids]
    assert "\ufffd" not in "".join(pieces) and "".join(pieces) + decoder.flush() == text
    assert any(piece == "" for piece in pieces)  # held back until the character completes


def test_incremental_decoder_flushes_an_unfinished_character(tiny):
    crab = tiny.encode("🦀")
    assert len(crab) > 1
    decoder = IncrementalDecoder(tiny)
    assert [decoder.feed(i) for i in tiny.encode("a") + crab[:-1]] == ["a"] + [""] * (len(crab) - 1)
    assert decoder.flush() == "\ufffd"


@pytest.mark.parametrize("skip_special_tokens", [True, False])
def test_incremental_decoder_property_tiny(tiny, skip_special_tokens):
    rng = random.Random(0)
    sequences = [tiny.encode(t) for t in TEXTS] + [tiny.encode_chat(c) for c in CHATS]
    sequences += [[rng.randrange(tiny.vocab_size) for _ in range(rng.randrange(1, 60))] for _ in range(200)]
    for ids in sequences:
        _assert_streams_like_decode(tiny, ids, rng, skip_special_tokens=skip_special_tokens)


def test_incremental_decoder_sentencepiece_style():
    """Metaspace decoding drops the first token's leading space, so pieces must come from a window."""
    backend = BackendTokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                                               show_progress=False))
    tok = Tokenizer(backend, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    rng = random.Random(2)
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.decode(ids) == text.removeprefix(" ")
        for skip_special_tokens in (True, False):
            _assert_streams_like_decode(tok, [1, *ids, 2], rng, skip_special_tokens=skip_special_tokens)


# The real SmolLM2 tokenizer: fetched and converted once into the user cache (about 20 s cold).

@pytest.fixture(scope="module")
def smollm2_dir():
    from trtspec.hub import fetch_model

    return fetch_model("smollm2-135m")


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    return Tokenizer.from_dir(smollm2_dir)


def test_smollm2_matches_transformers(smollm2_dir, smollm2):
    from transformers import AutoTokenizer

    _assert_matches(smollm2, AutoTokenizer.from_pretrained(smollm2_dir))
    assert smollm2.eos_token_ids == (2,) and smollm2.bos_token_id == 1 and smollm2.vocab_size == 49152


def test_smollm2_chat_layout(smollm2):
    ids = smollm2.encode_chat(CHATS[0])
    assert ids[0] == 1 and ids[-4:] == [1, *smollm2.encode("assistant\n")]  # <|im_start|>assistant\n
    assert smollm2.apply_chat_template(CHATS[0]).startswith("<|im_start|>system\nYou are a helpful AI assistant")


def test_incremental_decoder_property_smollm2(smollm2):
    rng = random.Random(1)
    sequences = [smollm2.encode(t) for t in TEXTS] + [smollm2.encode_chat(c) for c in CHATS]
    sequences += [[rng.randrange(smollm2.vocab_size) for _ in range(rng.randrange(1, 60))] for _ in range(100)]
    for ids in sequences:
        _assert_streams_like_decode(smollm2, ids, rng, skip_special_tokens=True)


def _assert_matches(tok: Tokenizer, reference) -> None:
    for text in TEXTS:
        ids = reference.encode(text, add_special_tokens=False)
        assert tok.encode(text) == ids, text
        assert tok.encode(text, add_special_tokens=True) == reference.encode(text), text
        assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=True), text
        assert tok.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)
    chats = CHATS + [[{"role": "user", "content": text}] for text in TEXTS if text]
    for chat in chats:
        for gen in (True, False):
            expected = reference.apply_chat_template(chat, tokenize=False, add_generation_prompt=gen)
            assert tok.apply_chat_template(chat, add_generation_prompt=gen) == expected, chat
            encoded = reference.apply_chat_template(chat, tokenize=True, add_generation_prompt=gen)
            assert tok.encode_chat(chat, add_generation_prompt=gen) == encoded["input_ids"], chat


def _assert_streams_like_decode(tok: Tokenizer, ids: list[int], rng: random.Random, **kwargs) -> None:
    decoder = IncrementalDecoder(tok, **kwargs)
    pieces, i = [], 0
    while i < len(ids):
        step = rng.choice([1, 1, 1, 2, 3])
        pieces.append(decoder.feed(ids[i:i + step]))
        i += step
    pieces.append(decoder.flush())
    assert "".join(pieces) == tok.decode(ids, **kwargs), ids
    expected = tok.decode(ids, **kwargs)
    if "\ufffd" not in expected:  # valid text never streams a partial character
        assert all("\ufffd" not in piece for piece in pieces), ids
