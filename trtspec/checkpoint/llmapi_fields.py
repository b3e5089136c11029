"""The config.json fields TensorRT-LLM's LLM API (PyTorch backend) reads from a speculative-decoding checkpoint that
trtspec does not convert: an EAGLE-3 draft and an MTP-capable base. Read here (config only) for `inspect` and for
the drafter checks of `trtspec.triton.llmapi_check` (deploy --flavour llmapi, doctor).

EAGLE-3 (tensorrt_llm/_torch/models/modeling_speculative.py, Eagle3DraftModel / Eagle3ForCausalLM): `hidden_size`,
`target_hidden_size` (the width of the base's hidden states the draft's fc fuses; hidden_size when absent),
`num_hidden_layers` (midlayer count), `draft_vocab_size` (vocab_size when absent) with a `d2t` tensor when it differs
(`t2d` is not read), and `eagle_config` (eh_proj_before_attn, norm_before_fc, ...). The base layers whose outputs are
fused are not read from the draft: TensorRT-LLM captures {1, N//2 - 1, N - 4} of an N-layer base unless
speculative_config sets `eagle3_layers_to_capture` (drafts that name theirs: `eagle3_layer_ids`).

MTP: DeepSeek-V3 / R1 declare `num_nextn_predict_layers`, Qwen3-Next `mtp_num_hidden_layers`.
"""

from __future__ import annotations

MTP_LAYER_FIELDS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")
EAGLE3_LAYER_FIELD = "eagle_aux_hidden_state_layer_ids"


def mtp_layers(config: dict) -> int:
    """The MTP modules a base declares (0: none)."""
    return mtp_field(config)[1]


def mtp_field(config: dict) -> tuple[str | None, int]:
    """(the field that declares MTP modules, how many); (None, 0) when the base declares none."""
    for key in MTP_LAYER_FIELDS:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return key, value
    return None, 0


def eagle3_layer_ids(config: dict) -> tuple[str | None, list | None]:
    """(where the draft's config names the base layers it fuses, the ids as written); (None, None) when it names
    none. `eagle_config.eagle_aux_hidden_state_layer_ids` is how NVIDIA's Model Optimizer exports name them, a
    top-level `eagle_aux_hidden_state_layer_ids` how vLLM speculators do (counting one above TensorRT-LLM: its id i
    is the output of layer i - 1)."""
    eagle = config.get("eagle_config")
    if isinstance(eagle, dict) and eagle.get(EAGLE3_LAYER_FIELD) is not None:
        return f"eagle_config.{EAGLE3_LAYER_FIELD}", eagle[EAGLE3_LAYER_FIELD]
    if config.get(EAGLE3_LAYER_FIELD) is not None:
        return EAGLE3_LAYER_FIELD, config[EAGLE3_LAYER_FIELD]
    return None, None


def default_capture(num_layers: int) -> tuple[int, ...] | None:
    """The base layers TensorRT-LLM's EAGLE-3 captures when speculative_config names none (None: a base of 5 layers
    or fewer, which has no default)."""
    if not isinstance(num_layers, int) or num_layers <= 5:
        return None
    return (1, num_layers // 2 - 1, num_layers - 4)
