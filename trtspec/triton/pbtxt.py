"""Triton model configs as data, rendered to `config.pbtxt` text (protobuf text format of `ModelConfig`).

A small mirror of `model_config.proto`: only the fields the tensorrtllm_backend layout uses. Rendering is pure
and fills every value from the data, so no `${…}` placeholder can survive; tests parse the text back through
Triton's own `ModelConfig` protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Tensor:
    name: str
    data_type: str  # e.g. "TYPE_INT32"
    dims: tuple[int, ...] = (1,)
    optional: bool = False
    reshape: tuple[int, ...] | None = None  # `reshape: { shape: [ ] }` turns a [1] scalar into [] for the backend
    allow_ragged_batch: bool = False


@dataclass(frozen=True)
class Step:
    """One ensemble step: model tensor ← ensemble tensor (input_map), model tensor → ensemble tensor."""

    model_name: str
    input_map: dict[str, str]
    output_map: dict[str, str]


@dataclass(frozen=True, kw_only=True)
class TritonModelConfig:
    """One model's config.pbtxt as data: the fields of Triton's `ModelConfig` protobuf that trtspec writes."""

    name: str
    max_batch_size: int | None  # None: left out (a Python model's auto_complete_config sets it)
    backend: str | None = None
    platform: str | None = None
    inputs: tuple[Tensor, ...] = ()
    outputs: tuple[Tensor, ...] = ()
    decoupled: bool | None = None
    dynamic_batching: dict | None = None  # preferred_batch_size, max_queue_delay_microseconds
    instance_count: int | None = None  # instance_group [{count, kind: KIND_CPU}]
    parameters: dict[str, str] = field(default_factory=dict)
    steps: tuple[Step, ...] = ()  # ensemble_scheduling


def render(config: TritonModelConfig) -> str:
    """The config.pbtxt text, sections in the order tensorrtllm_backend's templates use."""
    parts = [f"name: {_q(config.name)}"]
    if config.backend:
        parts.append(f"backend: {_q(config.backend)}")
    if config.platform:
        parts.append(f"platform: {_q(config.platform)}")
    if config.max_batch_size is not None:
        parts.append(f"max_batch_size: {config.max_batch_size}")
    if config.decoupled is not None:
        parts.append(model_transaction_policy(config.decoupled))
    if config.dynamic_batching is not None:
        parts.append(dynamic_batching(**config.dynamic_batching))
    parts.append(tensors("input", config.inputs))
    parts.append(tensors("output", config.outputs))
    if config.instance_count is not None:
        parts.append(instance_group(config.instance_count))
    if config.steps:
        parts.append(ensemble_scheduling(config.steps))
    parts.extend(parameter(k, v) for k, v in config.parameters.items())
    return "\n".join(parts) + "\n"


def model_transaction_policy(decoupled: bool) -> str:
    return f"model_transaction_policy {{\n  decoupled: {'true' if decoupled else 'false'}\n}}"


def dynamic_batching(*, preferred_batch_size: list[int] | None = None, max_queue_delay_microseconds: int = 0) -> str:
    lines = ["dynamic_batching {"]
    if preferred_batch_size:
        lines.append(f"  preferred_batch_size: [ {', '.join(map(str, preferred_batch_size))} ]")
    lines.append(f"  max_queue_delay_microseconds: {max_queue_delay_microseconds}")
    return "\n".join(lines + ["}"])


def tensors(kind: str, specs: tuple[Tensor, ...]) -> str:
    if not specs:
        return f"{kind} [ ]"
    return f"{kind} [\n" + ",\n".join(_tensor(t, output=kind == "output") for t in specs) + "\n]"


def _tensor(t: Tensor, *, output: bool = False) -> str:
    lines = [f"    name: {_q(t.name)}", f"    data_type: {t.data_type}", f"    dims: [ {', '.join(map(str, t.dims))} ]"]
    if t.reshape is not None:
        lines.append(f"    reshape: {{ shape: [ {', '.join(map(str, t.reshape))} ] }}")
    if t.optional and not output:  # ModelOutput has no `optional`
        lines.append("    optional: true")
    if t.allow_ragged_batch:
        lines.append("    allow_ragged_batch: true")
    return "  {\n" + "\n".join(lines) + "\n  }"


def instance_group(count: int) -> str:
    return f"instance_group [\n  {{\n    count: {count}\n    kind: KIND_CPU\n  }}\n]"


def ensemble_scheduling(steps: tuple[Step, ...]) -> str:
    body = ",\n".join(_step(s) for s in steps)
    return f"ensemble_scheduling {{\n  step [\n{body}\n  ]\n}}"


def _step(step: Step) -> str:
    lines = ["    {", f"      model_name: {_q(step.model_name)}", "      model_version: -1"]
    lines += [f"      input_map {{ key: {_q(k)} value: {_q(v)} }}" for k, v in step.input_map.items()]
    lines += [f"      output_map {{ key: {_q(k)} value: {_q(v)} }}" for k, v in step.output_map.items()]
    return "\n".join(lines + ["    }"])


def parameter(key: str, value: str) -> str:
    return f"parameters {{\n  key: {_q(key)}\n  value: {{ string_value: {_q(str(value))} }}\n}}"


def _q(text: str) -> str:
    """A protobuf text-format string literal."""
    if any(ord(c) < 32 for c in text):
        raise ValueError(f"control character in config value {text!r}")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
