"""A tiny byte-level BPE tokenizer folder (tokenizer.json + tokenizer_config.json with a chat template)."""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
TEXTS = ["Hello world, this is a tiny tokenizer.", "Speculative decoding drafts tokens and verifies them.",
         "Medusa heads and EAGLE drafts propose; the target model accepts.", "Grüße, naïve café — 東京 ✓ 🙂",
         "def f(x):\n    return x * 2\n", "The quick brown fox jumps over the lazy dog. 0123456789"]


def write_tiny_tokenizer(out: Path, *, vocab_size: int = 320) -> int:
    """Train a byte-level BPE on a few strings into `out`; return its vocabulary size (special tokens included).

    A tiny model built with that vocabulary generates ids the tokenizer can decode (any byte sequence,
    including incomplete UTF-8, which is what streaming detokenization must survive)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(TEXTS * 3, trainer)
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                           special_tokens=[("<s>", 1)])
    backend.save(str(out / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    return backend.get_vocab_size(with_added_tokens=True)
