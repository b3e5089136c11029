"""OpenAI's request bodies (/v1/completions, /v1/chat/completions) checked and turned into what the ensemble is sent.

Pure: no I/O. A field the deployment cannot serve is an APIError naming it, in OpenAI's error shape. Sampling keeps
OpenAI's meaning (temperature 1 samples, 0 is greedy) and is spelled out for the ensemble, whose unsent fields mean
greedy. A chat is rendered with the model's template here when the tokenizer is at hand.
"""

from __future__ import annotations

import dataclasses

import json
from dataclasses import dataclass

from trtspec.errors import ConfigError, TrtspecError
from trtspec.speculative.loop import GenerationConfig
from trtspec.speculative.penalties import Penalties
from trtspec.speculative.sampling import SamplingParams

COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
CHAT_MAX_TOKENS = 512  # chat without max_tokens when the engine's room is unknown (else: up to its max_seq_len)
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 invalid_request_error."""
    return APIError(400, message, param=param, code=code)


@dataclass(frozen=True)
class Target:
    """What a request is checked against: the served model's name, the deployment's tokenizer (trtspec's
    Tokenizer, or None), whether the deployment renders a user message with its own chat template
    (`apply_chat_template`) and its engine's max_seq_len (None: unknown)."""

    name: str
    tokenizer: object = None
    renders_chats: bool = True
    max_seq_len: int | None = None


@dataclass
class Call:
    """One parsed request: what to send the ensemble and how to answer."""

    chat: bool
    prompt: str  # text_input
    chat_template: bool  # the deployment renders it (one user message, no tokenizer here)
    options: GenerationConfig
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    echo: str = ""  # completions' echo: the prompt, before the completion
    prompt_tokens: int | None = None  # counted here (with the tokenizer), when the server does not say
    logprobs: bool = False  # answer each generated token's log probability (the chosen token's; no alternatives)


def parse_request(body: object, target: Target, *, chat: bool) -> Call:
    """A request body → Call, or APIError naming the field that cannot be served."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request(f"you must provide a model parameter (this server serves {target.name!r})", "model")
    if model != target.name:
        raise APIError(404, f"The model {model!r} does not exist; this server serves {target.name!r}",
                       param="model", code="model_not_found")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request(f"n = {n!r}: one choice per request (n = 1) is supported; send n requests instead", "n")
    _refuse(body, chat)
    if chat:
        prompt, template, counted = _chat_prompt(body.get("messages"), target)
    else:
        prompt, template, counted = _completion_prompt(body.get("prompt"), target)
    usage = body.get("stream_options") or {}
    if not isinstance(usage, dict):
        raise bad_request("stream_options must be an object", "stream_options")
    echo = not chat and _boolean(body.get("echo", False), "echo")
    stream = _boolean(body.get("stream", False), "stream")
    logprobs = _logprobs(body, chat, stream, target)
    options = _options(body, chat, counted, target)
    if logprobs:
        options = dataclasses.replace(options, return_log_probs=True)
    return Call(chat, prompt, template, options, stop=_stops(body.get("stop")), stream=stream,
                include_usage=_boolean(usage.get("include_usage", False), "stream_options.include_usage"),
                echo=prompt if echo else "", prompt_tokens=counted, logprobs=logprobs)


def _logprobs(body: dict, chat: bool, stream: bool, target: Target) -> bool:
    """Whether to answer log probabilities: chat's `logprobs: true` with top_logprobs 0 (or none), completions'
    `logprobs: 0`; the chosen token's only (the engine reports no alternatives), in a whole reply, named by the
    tokenizer."""
    field = "logprobs"
    value = body.get(field)
    if chat:
        wanted = _boolean(value if value is not None else False, field)
        top = body.get("top_logprobs")
        if top not in (None, 0):
            raise bad_request(f"top_logprobs = {json.dumps(top)[:40]}: this server reports the chosen token's log "
                              "probability only (top_logprobs 0)", "top_logprobs")
    else:
        if value is not None and (isinstance(value, bool) or value != 0):
            raise bad_request(f"logprobs = {json.dumps(value)[:40]}: this server reports the chosen token's log "
                              "probability only (logprobs 0)", field)
        wanted = value is not None
    if wanted and stream:
        raise bad_request("logprobs with stream: ask for a whole reply (stream false) to get log probabilities",
                          field)
    if wanted and target.tokenizer is None:
        raise bad_request("logprobs needs the model's tokenizer to name the tokens: start the frontend with it "
                          "(`trtspec serve`, or `trtspec openai --tokenizer DIR|REPO`)", field)
    return wanted


def _options(body: dict, chat: bool, prompt_tokens: int | None, target: Target) -> GenerationConfig:
    """max_tokens (chat's max_completion_tokens too), sampling, and trtspec's draft_method / use_speculation."""
    max_tokens = body.get("max_completion_tokens") if chat else None
    max_tokens = body.get("max_tokens") if max_tokens is None else max_tokens
    if max_tokens is None:
        max_tokens = _default_max_tokens(prompt_tokens, target) if chat else COMPLETION_MAX_TOKENS
    method = body.get("draft_method")
    if method is not None and not isinstance(method, str):
        raise bad_request("draft_method must be a string (none, ngram, suffix, lookahead, hybrid or the engine's "
                          "own)", "draft_method")
    try:
        return GenerationConfig(max_tokens=_integer(max_tokens, "max_tokens", low=1), sampling=_sampling(body),
                                penalties=_penalties(body), method=method or None,
                                no_spec=not _boolean(body.get("use_speculation", True), "use_speculation"))
    except ConfigError as e:
        raise bad_request(str(e)) from None


def _completion_prompt(prompt, target: Target) -> tuple[str, bool, int | None]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise bad_request("prompt: one text prompt per request is supported (not a batch, not token ids)", "prompt")
    if not isinstance(prompt, str) or not prompt:
        raise bad_request("prompt must be a non-empty string", "prompt")
    counted = None if target.tokenizer is None else len(target.tokenizer.encode(prompt, add_special_tokens=True))
    return prompt, False, counted


def _chat_prompt(messages, target: Target) -> tuple[str, bool, int | None]:
    """The chat as the text to send: rendered here with the tokenizer's template (as the text whose encoding
    by the deployment's preprocessing, special tokens added, gives the rendered chat's ids), or one user
    message for the deployment's own template."""
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    chat = [_message(m, i) for i, m in enumerate(messages)]
    single = len(chat) == 1 and chat[0]["role"] == "user" and target.renders_chats
    if target.tokenizer is not None and target.tokenizer.chat_template:
        try:
            ids = target.tokenizer.encode_chat(chat)
            text = target.tokenizer.apply_chat_template(chat)
        except TrtspecError as e:
            raise bad_request(str(e), "messages") from None
        bos = target.tokenizer.special_tokens.get("bos_token")
        for candidate in (text, text[len(bos):] if bos and text.startswith(bos) else None):
            if candidate and target.tokenizer.encode(candidate, add_special_tokens=True) == ids:
                return candidate, False, len(ids)
        if single:
            return chat[0]["content"], True, len(ids)
        return text, False, len(ids)
    if single:
        return chat[0]["content"], True, None
    raise bad_request("this server renders a chat of one user message only (it was started without the model's "
                      "tokenizer: `trtspec openai --tokenizer`)", "messages")


def _default_max_tokens(prompt_tokens: int | None, target: Target) -> int:
    if target.max_seq_len is not None and prompt_tokens is not None:
        return max(1, target.max_seq_len - prompt_tokens)
    return CHAT_MAX_TOKENS


def _refuse(body: dict, chat: bool) -> None:
    """APIError for an OpenAI field set to what the CPU / TensorRT-LLM engines cannot do here."""
    unsupported = {
        "best_of": lambda v: v not in (None, 1),
        "logit_bias": lambda v: bool(v),
        "suffix": lambda v: bool(v),
        "tools": lambda v: bool(v),
        "functions": lambda v: bool(v),
        "tool_choice": lambda v: v not in (None, "none"),
        "function_call": lambda v: v not in (None, "none"),
        "response_format": lambda v: v not in (None, {"type": "text"}),
    }
    for name, refused in unsupported.items():
        if name in body and refused(body[name]):
            raise bad_request(f"{name} = {json.dumps(body[name])[:80]} is not supported by this server "
                              "(trtspec's OpenAI frontend)", name)


def _sampling(body: dict) -> SamplingParams:
    """OpenAI's temperature (default 1: sampling), top_p (default 1) and vLLM's top_k (0 or -1: off), seed."""
    temperature = _number(body.get("temperature", 1.0), "temperature", low=0.0)
    top_p = _number(body.get("top_p", 1.0), "top_p", low=0.0, high=1.0)
    top_k = _integer(body.get("top_k", 0), "top_k", low=-1)
    seed = body.get("seed")
    if seed is not None:
        seed = _integer(seed, "seed", low=0, high=2**64 - 1)
    if top_p == 0.0:  # only the most likely token survives
        temperature, top_p = 0.0, 1.0
    return SamplingParams(temperature=temperature, top_k=max(top_k, 0), top_p=top_p, seed=seed)


def _penalties(body: dict) -> Penalties:
    """OpenAI's presence_penalty and frequency_penalty (-2..2, default 0) and vLLM's repetition_penalty (> 0, default
    1), applied as TensorRT-LLM applies them: over the prompt's and the output's tokens (speculative/penalties.py)."""
    presence = _number(body.get("presence_penalty", 0.0) or 0.0, "presence_penalty", low=-2.0, high=2.0)
    frequency = _number(body.get("frequency_penalty", 0.0) or 0.0, "frequency_penalty", low=-2.0, high=2.0)
    repetition = body.get("repetition_penalty", 1.0)
    repetition = 1.0 if repetition is None else _number(repetition, "repetition_penalty", low=0.0)
    if repetition == 0:
        raise bad_request("repetition_penalty = 0 is out of range (it must be > 0; 1 is off)", "repetition_penalty")
    return Penalties(repetition=repetition, presence=presence, frequency=frequency)


def _stops(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("stop must be a string or a list of strings", "stop")
    return tuple(s for s in stop if s)


def _message(message, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_request(f"{where} must be an object with role and content", "messages")
    role = ROLES.get(message.get("role"))
    if role is None:
        raise bad_request(f"{where}.role = {message.get('role')!r}: system, developer, user or assistant messages are "
                          "supported (not tool calls)", "messages")
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad_request(f"{where}.content: only text parts are supported, not {kind!r}", "messages")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise bad_request(f"{where}.content must be a string or a list of text parts", "messages")
    return {"role": role, "content": content}


def _number(value, name: str, *, low: float, high: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise bad_request(f"{name} must be a number, got {json.dumps(value)}", name)
    if value < low or (high is not None and value > high):
        bounds = f"between {low} and {high}" if high is not None else f">= {low}"
        raise bad_request(f"{name} = {value} is out of range (it must be {bounds})", name)
    return float(value)


def _integer(value, name: str, *, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{name} must be an integer, got {json.dumps(value)}", name)
    if value < low or (high is not None and value > high):
        raise bad_request(f"{name} = {value} is out of range (it must be >= {low}"
                          f"{f' and <= {high}' if high is not None else ''})", name)
    return value


def _boolean(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {json.dumps(value)}", name)
    return value
