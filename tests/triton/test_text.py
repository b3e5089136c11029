"""Stateless streaming detokenization and TensorRT-LLM word lists."""

from __future__ import annotations

import numpy as np
import pytest

from trtspec.runtime.tokenizer import Tokenizer
from trtspec.testing import write_tiny_tokenizer
from trtspec.triton.text import CONTEXT_TOKENS, decode_word_list, delta_text, encode_query, encode_word_lists


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    write_tiny_tokenizer(path)
    return Tokenizer.from_dir(path)


def _stream(tokenizer, ids, chunks):
    pieces, sent = [], []
    for n, chunk in enumerate(chunks):
        final = n == len(chunks) - 1
        pieces.append(delta_text(tokenizer, sent[-CONTEXT_TOKENS:], chunk, final=final))
        sent += chunk
    return "".join(pieces)


def test_stream_equals_whole_text_for_random_ids_and_chunks(tokenizer):
    """Random ids decode to arbitrary bytes (split multi-byte characters, invalid UTF-8): the concatenated
    stream still equals decoding everything at once, for any chunking."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        ids = rng.integers(0, tokenizer.vocab_size, int(rng.integers(1, 60))).tolist()
        cuts = sorted(set(rng.integers(1, len(ids) + 1, int(rng.integers(0, 8))).tolist()) | {len(ids)})
        chunks = [ids[a:b] for a, b in zip([0, *cuts], cuts)]
        assert _stream(tokenizer, ids, chunks) == tokenizer.decode(ids)


def test_multibyte_character_is_held_back_until_complete(tokenizer):
    ids = tokenizer.encode("東")
    assert len(ids) > 1  # byte-level: several tokens for one character
    assert delta_text(tokenizer, [], ids[:1], final=False) == ""
    assert delta_text(tokenizer, ids[:1], ids[1:], final=False) == "東"
    assert delta_text(tokenizer, [], ids[:1], final=True) == "\ufffd"  # the sequence ended mid-character


def test_word_lists_round_trip(tokenizer):
    lists = encode_word_lists(tokenizer, [["Hello", "the model"], [], ["x", ""]])
    assert lists.shape[:2] == (3, 2) and lists.dtype == np.int32
    assert decode_word_list(lists[0]) == (tuple(tokenizer.encode("Hello")), tuple(tokenizer.encode("the model")))
    assert decode_word_list(lists[1]) == ()
    assert decode_word_list(lists[2]) == (tuple(tokenizer.encode("x")),)
    assert encode_word_lists(tokenizer, [[]]).shape == (1, 2, 0)


def test_query_with_and_without_chat_template(tokenizer):
    chat = encode_query(tokenizer, "hi", chat_template=True, add_special_tokens=True)
    assert chat == tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert encode_query(tokenizer, "hi", chat_template=False, add_special_tokens=True) == [1, *tokenizer.encode("hi")]
