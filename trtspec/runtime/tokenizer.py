"""The serving-path tokenizer: a Hugging Face model folder's tokenizer.json and chat template without transformers.

Mirrors what transformers 5.x does with the same files (encode, decode, apply_chat_template, BOS/EOS
handling), using only the `tokenizers` and `jinja2` packages, plus an incremental decoder for streaming.
"""

from __future__ import annotations

import hashlib
import json
import numbers
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import tokenizers
from jinja2.sandbox import ImmutableSandboxedEnvironment

from trtspec.errors import CheckpointError, ConfigError

REPLACEMENT_CHAR = "\ufffd"  # what decoding yields for bytes that do not (yet) form a UTF-8 character


def tokenizer_fingerprint(directory: Path) -> str:
    """SHA-256 of a tokenizer folder's tokenizer.json: a datastore built with one is only used with the same."""
    return hashlib.sha256((Path(directory) / "tokenizer.json").read_bytes()).hexdigest()


class Tokenizer:
    """Text ↔ token ids and chat rendering for one model folder."""

    def __init__(self, backend: tokenizers.Tokenizer, *, chat_template: str | None = None,
                 special_tokens: dict[str, str] | None = None, eos_token_ids: Sequence[int] = ()):
        self.backend = backend
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})  # bos_token, eos_token, ... → token text
        self.bos_token_id = self._token_id("bos_token")
        eos = [self._token_id("eos_token"), *eos_token_ids]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in eos if i is not None))
        self._template: jinja2.Template | None = None

    @classmethod
    def from_dir(cls, model_dir: Path | str) -> Tokenizer:
        """Read tokenizer.json, tokenizer_config.json (+ chat_template.jinja) and generation_config.json.

        As in transformers 5.x, tokenizer.json's post-processor alone decides what add_special_tokens adds:
        add_bos_token / add_eos_token in tokenizer_config.json are ignored when tokenizer.json exists.
        """
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise CheckpointError(f"{model_dir} has no tokenizer.json; pass a Hugging Face model folder "
                                  "(trtspec fetch makes one)")
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on malformed files
            raise CheckpointError(f"{path}: not a valid tokenizers file ({e})") from None
        config = _read_json(model_dir / "tokenizer_config.json")
        template = config.get("chat_template")
        if (jinja := model_dir / "chat_template.jinja").is_file():
            template = jinja.read_text(encoding="utf-8")
        generation = _read_json(model_dir / "generation_config.json")
        eos = generation.get("eos_token_id")
        return cls(backend, chat_template=_default_template(template, model_dir),
                   special_tokens={k: _token_text(v) for k, v in config.items() if _is_special_key(k, v)},
                   eos_token_ids=[eos] if isinstance(eos, int) else (eos or []))

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special tokens written in the text are parsed as such, as transformers does."""
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Text of `ids` (transformers 5.x ignores clean_up_tokenization_spaces for BPE, so no clean-up)."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> str:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the model's chat template."""
        if self._template is None:
            if not self.chat_template:
                raise ConfigError("this tokenizer has no chat_template in tokenizer_config.json; "
                                  "pass a raw prompt instead of chat messages")
            self._template = _compile_template(self.chat_template)
        try:
            return self._template.render(messages=[dict(m) for m in messages],
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.TemplateError as e:
            raise ConfigError(f"chat template failed on these messages: {e}") from None

    def encode_chat(self, messages: Sequence[dict], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (= transformers' apply_chat_template(tokenize=True))."""
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))

    def _token_id(self, key: str) -> int | None:
        text = self.special_tokens.get(key)
        return None if text is None else self.backend.token_to_id(text)


class IncrementalDecoder:
    """Streams text for token ids fed a few at a time, never splitting a UTF-8 character.

    Each step decodes a short window: the text of ids[prefix:] minus the text of ids[prefix:read] is new,
    unless it ends in U+FFFD (a character whose bytes are still arriving). Decoding a window rather than
    single ids keeps context-dependent decoders (SentencePiece's leading space) right. Invariant:
    "".join(feed(...) pieces) + flush() == tokenizer.decode(all ids), for any ids with byte-level BPE and
    for valid UTF-8 text with SentencePiece byte fallback (whose one-shot decode turns a whole run of byte
    tokens into U+FFFD when the run is invalid, where the stream keeps the valid bytes).
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0  # start of the decode window
        self._read = 0  # ids before this index have been emitted

    def feed(self, ids: int | Iterable[int]) -> str:
        """Add token ids; return the text they complete (possibly "")."""
        self.ids.extend([int(ids)] if isinstance(ids, numbers.Integral) else map(int, ids))
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        if len(text) <= len(prefix_text) or text.endswith(REPLACEMENT_CHAR):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(prefix_text):]

    def flush(self) -> str:
        """Return the held-back text at the end of a stream (an incomplete character decodes to U+FFFD)."""
        prefix_text = self._decode(self.ids[self._prefix:self._read])
        text = self._decode(self.ids[self._prefix:])
        self._prefix = self._read = len(self.ids)
        return text[len(prefix_text):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens) if ids else ""


def _compile_template(source: str) -> jinja2.Template:
    """Compile a chat template in the sandbox transformers uses, with the same globals and tojson filter."""

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson escapes HTML characters, which chat templates do not expect
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise CheckpointError(f"chat_template does not parse: {e} (line {e.lineno})") from None


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _default_template(template: str | list | None, model_dir: Path) -> str | None:
    # tokenizer_config.json may hold named templates: [{"name": "default", "template": ...}, ...]
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        if "default" not in named:
            raise CheckpointError(f"{model_dir}/tokenizer_config.json: chat_template lists {sorted(named)} "
                                  "but no 'default' template")
        return named["default"]
    return template


def _is_special_key(key: str, value) -> bool:
    return key.endswith("_token") and not key.startswith("add_") and _token_text(value) is not None


def _token_text(value) -> str | None:
    # special tokens are saved as text or as AddedToken dicts {"content": ..., ...}
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
