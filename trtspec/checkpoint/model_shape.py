"""A model's shape: one frozen dataclass, read from a checkpoint's `config.json` and carried by the engine manifest.

Two readers fill it: `checkpoint.hf_config.read_base_config` from a Hugging Face `config.json` (the converter's
input), and `ModelShape.from_trtllm` from a TensorRT-LLM checkpoint's `config.json` (the builders' input; field
names there are TensorRT-LLM's, written by `checkpoint/trtllm_config.py`). The engine manifest's `model` section is
this shape plus the ids the build read beside it (`engine.manifest.ModelInfo`).

Fields typed `... | None` beyond `dtype` and `rope_scaling` are None only in a shape read back from a manifest written
before manifests carried the whole shape (`engine.manifest.ModelInfo.from_dict`; its `rope_scaling` is None too, not
recorded there); both checkpoint readers fill them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trtspec.errors import CheckpointError, ConfigError, check_fields

# TensorRT-LLM's ReDrafter checkpoints: one class before 1.0 (LLaMA bases), one per base family from 1.0
# (checkpoint.redrafter ARCHITECTURES); the base's own shape is read from base_model_architecture's fields
REDRAFTER_ARCHITECTURES = ("ReDrafterForCausalLM", "ReDrafterForLLaMALM", "ReDrafterForQWenLM")
REDRAFTER_BASES = {"ReDrafterForCausalLM": ("LlamaForCausalLM",), "ReDrafterForLLaMALM": ("LlamaForCausalLM",),
                   "ReDrafterForQWenLM": ("Qwen2ForCausalLM",)}
TRTLLM_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MedusaForCausalLM", "EagleForCausalLM",
                        *REDRAFTER_ARCHITECTURES)
HIDDEN_ACTS = ("silu",)  # every supported family is SwiGLU; Medusa ResBlocks use the same activation
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """A LLaMA-style decoder (RMSNorm, RoPE, SwiGLU): dimensions, RoPE, biases, and its drafter's sizes."""

    architecture: str  # as config.json names it (HF: the base family's; TensorRT-LLM: also Medusa / Eagle / ReDrafter)
    dtype: str | None  # the stored dtype (None: an HF config.json that names none)
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int | None
    num_kv_heads: int
    head_dim: int
    intermediate_size: int | None
    rms_norm_eps: float | None
    rope_theta: float | None
    rope_scaling: dict | None  # HF rope_scaling dict; TRT-LLM adds "type" next to HF's "rope_type"
    max_position_embeddings: int | None
    hidden_act: str | None
    qkv_bias: bool | None
    o_bias: bool | None
    mlp_bias: bool | None
    tie_word_embeddings: bool | None = False
    logits_dtype: str = "float32"  # the engine's logits (TensorRT-LLM config.json; Triton's logits_datatype)
    num_medusa_heads: int = 0
    num_medusa_layers: int | None = 0
    max_draft_len: int | None = 0  # the checkpoint's (a build may choose a smaller K)
    eagle: ModelShape | None = None  # the drafter's eagle_net_config when architecture is EagleForCausalLM
    num_eagle_layers: int = 0  # EagleNet invocations (tree depth), not transformer layers
    max_non_leaves_per_layer: int = 0  # EAGLE: most expanding nodes per tree level

    def __post_init__(self) -> None:
        if self.num_heads is not None and self.num_heads % self.num_kv_heads:
            raise CheckpointError(f"num_attention_heads={self.num_heads} is not a multiple of "
                                  f"num_key_value_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise CheckpointError(f"head_size={self.head_dim} is odd; rotary embeddings need an even head size")

    # the EAGLE draft's KV cache, as the runtime allocates it (0: no draft network)
    @property
    def draft_layers(self) -> int:
        return self.eagle.num_layers if self.eagle else 0

    @property
    def draft_num_kv_heads(self) -> int:
        return self.eagle.num_kv_heads if self.eagle else 0

    @property
    def draft_head_dim(self) -> int:
        return self.eagle.head_dim if self.eagle else 0

    @classmethod
    def from_trtllm(cls, config: dict) -> ModelShape:
        """Read a TensorRT-LLM `config.json` dict; CheckpointError names the first bad or missing field."""
        arch = _choice(config, "architecture", TRTLLM_ARCHITECTURES)
        if arch in REDRAFTER_ARCHITECTURES:  # the base's shape; its drafter's fields: checkpoint.redrafter
            _choice(config, "base_model_architecture", REDRAFTER_BASES[arch])
        hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
        kv_heads = _int(config, "num_key_value_heads") if config.get("num_key_value_heads") is not None else heads
        head_dim = next((_int(config, k) for k in ("head_size", "head_dim") if config.get(k) is not None),
                        hidden // heads)
        attn_bias = _bool(config, "attn_bias")
        speculative = _medusa_fields(config) if arch == "MedusaForCausalLM" else {}
        if arch == "EagleForCausalLM":
            speculative = _eagle_fields(config)
        return cls(
            architecture=arch, hidden_size=hidden, num_layers=_int(config, "num_hidden_layers"),
            num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
            intermediate_size=_int(config, "intermediate_size"), vocab_size=_int(config, "vocab_size"),
            rms_norm_eps=_float(config, "norm_epsilon", 1e-6), rope_theta=_float(config, "rotary_base", 10000.0),
            rope_scaling=_rope_scaling(config), max_position_embeddings=_int(config, "max_position_embeddings"),
            # Qwen2 has biases on q/k/v only; LLaMA's attention_bias puts one on o_proj (TRT `dense`) too.
            qkv_bias=attn_bias, o_bias=attn_bias and not _is_qwen(config), mlp_bias=_bool(config, "mlp_bias"),
            hidden_act=_choice(config, "hidden_act", HIDDEN_ACTS), dtype=_choice(config, "dtype", DTYPES),
            tie_word_embeddings=bool(config.get("tie_word_embeddings")),
            logits_dtype=config.get("logits_dtype") or "float32",
            **speculative,
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> ModelShape:
        """The inverse of `to_dict` (a manifest's `model` section); ConfigError names `where` and the bad key."""
        check_fields(cls, data, where)
        data = dict(data)
        if data.get("eagle") is not None:
            data["eagle"] = ModelShape.from_dict(data["eagle"], f"{where}.eagle")
        try:
            return cls(**data)
        except (TypeError, CheckpointError) as e:
            raise ConfigError(f"{where}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class ReDrafterBeams:
    """A ReDrafter engine's beam search, fixed at build (the checkpoint's redrafter_* fields): `num_beams` paths of
    `draft_len_per_beam` tokens each, so K = num_beams x draft_len_per_beam (TensorRT-LLM tensorrt_llm/builder.py
    `build`; the C++ runtime reads the same two fields from pretrained_config, gptJsonConfig.cpp). The manifest's
    `redrafter` section is `to_dict`."""

    num_beams: int
    draft_len_per_beam: int
    greedy_search: bool = True  # False: requests' temperatures pick the beams' tokens (examples/redrafter/README.md)

    def __post_init__(self):
        for key in ("num_beams", "draft_len_per_beam"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"redrafter {key} must be a positive integer, found {value!r}")
        if not isinstance(self.greedy_search, bool):
            raise ConfigError(f"redrafter greedy_search must be true or false, found {self.greedy_search!r}")

    @property
    def max_draft_len(self) -> int:
        return self.num_beams * self.draft_len_per_beam

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict, where: str) -> ReDrafterBeams:
        check_fields(cls, data, where)
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in data]
        if missing:
            raise ConfigError(f"{where}: missing key{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}")
        try:
            return cls(**data)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def from_trtllm(cls, config: dict) -> ReDrafterBeams:
        """From a ReDrafter checkpoint's config.json dict; CheckpointError names the bad field."""
        greedy = config.get("redrafter_greedy_search", True)
        if not isinstance(greedy, bool):
            raise CheckpointError(f"config field redrafter_greedy_search must be true or false, found {greedy!r}")
        return cls(num_beams=_int(config, "redrafter_num_beams"),
                   draft_len_per_beam=_int(config, "redrafter_draft_len_per_beam"), greedy_search=greedy)


@dataclass(frozen=True, kw_only=True)
class ReDrafterNet:
    """A ReDrafter checkpoint's drafter network (its redrafter_* size fields; TensorRT-LLM
    tensorrt_llm/models/redrafter/drafter.py): `input_proj` (2·hidden → exit_dim, bias) only when exit_dim ≠
    2·hidden, `num_layers` ResBlocks x + silu(linear(x)) over exit_dim, the lm_head (exit_dim → vocab), and with
    `rnn` the recurrence rnn_w(embedding) + rnn_u(previous) (hidden → hidden) over the beam's tokens."""

    num_layers: int
    hidden_size: int
    exit_dim: int
    rnn: bool

    @property
    def has_input_proj(self) -> bool:
        return self.exit_dim != 2 * self.hidden_size

    @classmethod
    def from_trtllm(cls, config: dict) -> ReDrafterNet:
        layers = config.get("redrafter_num_layers")
        if not isinstance(layers, int) or isinstance(layers, bool) or layers < 0:
            raise CheckpointError(f"config field redrafter_num_layers must be a non-negative integer, found {layers!r}")
        hidden = _int(config, "redrafter_hidden_size")
        if hidden != config.get("hidden_size"):
            raise CheckpointError(f"config field redrafter_hidden_size {hidden} differs from hidden_size "
                                  f"{config.get('hidden_size')}: the drafter reads the base's hidden states")
        return cls(num_layers=layers, hidden_size=hidden, exit_dim=_int(config, "redrafter_exit_dim"),
                   rnn=_bool(config, "redrafter_is_rnn"))


def _medusa_fields(config: dict) -> dict:
    return {"num_medusa_heads": _int(config, "num_medusa_heads"),
            "num_medusa_layers": _int(config, "num_medusa_layers"), "max_draft_len": _int(config, "max_draft_len")}


def _eagle_fields(config: dict) -> dict:
    net = config.get("eagle_net_config")
    if not isinstance(net, dict):
        raise CheckpointError(f"config field eagle_net_config must be an object, found {net!r}")
    try:
        draft = ModelShape.from_trtllm(net)
    except CheckpointError as e:
        raise CheckpointError(f"eagle_net_config: {e}") from None
    return {"eagle": draft, "num_eagle_layers": _int(config, "num_eagle_layers"),
            "max_non_leaves_per_layer": _int(config, "max_non_leaves_per_layer"),
            "max_draft_len": _int(config, "max_draft_len")}


def _is_qwen(config: dict) -> bool:
    return ("Qwen2ForCausalLM" in (config["architecture"], config.get("base_model_architecture"))
            or "qwen_type" in config or "qwen" in str(config.get("model_type", "")))


def _rope_scaling(config: dict) -> dict | None:
    scaling = config.get("rotary_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"config field rotary_scaling must be an object or null, found {scaling!r}")
    return dict(scaling) if scaling else None


def _int(config: dict, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config field {key} must be a positive integer, found {value!r}")
    return value


def _float(config: dict, key: str, default: float) -> float:
    value = config.get(key, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise CheckpointError(f"config field {key} must be a positive number, found {value!r}")
    return float(value)


def _bool(config: dict, key: str) -> bool:
    value = config.get(key, False)
    if not isinstance(value, bool):
        raise CheckpointError(f"config field {key} must be true or false, found {value!r}")
    return value


def _choice(config: dict, key: str, choices: tuple[str, ...]) -> str:
    value = config.get(key)
    if value not in choices:
        raise CheckpointError(f"config field {key}={value!r} is not supported; trtspec's reference model "
                              f"takes {', '.join(choices)}")
    return value
