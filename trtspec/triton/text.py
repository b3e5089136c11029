"""Text ↔ tokens for the Triton pre- and post-processing models (tokenizers only, no transformers).

Streaming detokenization is stateless, because each engine response may pass through a different
postprocessing instance: the engine sends the new tokens together with the few tokens before them, and the
delta is render(context + new) minus render(context). A trailing replacement character (a multi-byte
character whose bytes are not all generated yet) is held back until its bytes arrive or the sequence ends,
so the concatenated stream equals the text of the whole output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trtspec.runtime.tokenizer import Tokenizer

CONTEXT_TOKENS = 16  # tokens of context the engine sends with each streamed chunk
REPLACEMENT = "\ufffd"


def encode_query(tokenizer: Tokenizer, text: str, *, chat_template: bool, add_special_tokens: bool) -> list[int]:
    """One prompt's ids: through the chat template (a single user turn) or as raw text."""
    if chat_template and tokenizer.chat_template is not None:
        return tokenizer.encode_chat([{"role": "user", "content": text}])
    return tokenizer.encode(text, add_special_tokens=add_special_tokens)


def encode_word_lists(tokenizer: Tokenizer, batch: Sequence[Sequence[str]]) -> np.ndarray:
    """Stop / bad word lists in TensorRT-LLM's [B, 2, L] layout: row 0 the concatenated ids (padded with 0),
    row 1 the cumulative end offsets (padded with -1). Empty strings are skipped; no words gives [B, 2, 0]."""
    rows = []
    for words in batch:
        ids, offsets = [], []
        for word in words:
            if word:
                ids += tokenizer.encode(word)
                offsets.append(len(ids))
        rows.append((ids, offsets))
    width = max((len(ids) for ids, _ in rows), default=0)
    out = np.zeros((len(rows), 2, width), np.int32)
    out[:, 1, :] = -1
    for b, (ids, offsets) in enumerate(rows):
        out[b, 0, :len(ids)] = ids
        out[b, 1, :len(offsets)] = offsets
    return out


def embedding_bias(tokenizer: Tokenizer, vocab_size: int, words: Sequence[Sequence[str]] | None,
                   weights: np.ndarray | None, batch: int) -> np.ndarray:
    """The EMBEDDING_BIAS tensor as tensorrtllm_backend's preprocessing builds it: [B, vocab] FP32, every token of
    each word gets that word's weight added (a word's tokens as the tokenizer encodes it alone, without special
    tokens); [B, 0] without words. Raises ValueError when a row's words and weights differ in number."""
    if words is None or weights is None:
        return np.zeros((batch, 0), np.float32)
    bias = np.zeros((batch, vocab_size), np.float32)
    for b in range(batch):
        row_words = [w for w in words[b]]
        row_weights = np.asarray(weights[b], np.float32).reshape(-1)
        if len(row_words) != len(row_weights):
            raise ValueError(f"embedding_bias_words has {len(row_words)} words and embedding_bias_weights "
                             f"{len(row_weights)} weights; they must match one to one")
        for word, weight in zip(row_words, row_weights):
            for token in tokenizer.encode(word) if word else ():
                if 0 <= token < vocab_size:
                    bias[b, token] += weight
    return bias


def decode_word_list(flat: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """One item of a [2, L] word list back to token sequences."""
    flat = np.asarray(flat).reshape(2, -1)
    words, start = [], 0
    for end in flat[1]:
        if end < 0:
            break
        words.append(tuple(int(t) for t in flat[0, start:end]))
        start = int(end)
    return tuple(w for w in words if w)


def render(tokenizer: Tokenizer, ids: Sequence[int], *, final: bool, skip_special_tokens: bool = True) -> str:
    """The text of ids, less a trailing incomplete character unless this is the end of the sequence."""
    text = tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
    return text[:-1] if not final and text.endswith(REPLACEMENT) else text


def delta_text(tokenizer: Tokenizer, context: Sequence[int], new: Sequence[int], *, final: bool,
               skip_special_tokens: bool = True) -> str:
    """The text that `new` adds after `context` (both token ids) for a streamed chunk."""
    before = render(tokenizer, context, final=False, skip_special_tokens=skip_special_tokens) if len(context) else ""
    after = render(tokenizer, [*context, *new], final=final, skip_special_tokens=skip_special_tokens)
    if after.startswith(before):
        return after[len(before):]
    # Should not happen with byte-level or SentencePiece decoders; fall back to the new tokens alone.
    return render(tokenizer, new, final=final, skip_special_tokens=skip_special_tokens)
