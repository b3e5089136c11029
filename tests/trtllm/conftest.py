"""Config-only TensorRT-LLM checkpoints with the published 7B/8B shapes: planning needs config.json, not weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

# TensorRT-LLM examples/medusa/convert_checkpoint.py: the config.json examples/medusa/convert_checkpoint.py writes for Vicuna-7B.
VICUNA_7B = {
    "architecture": "LlamaForCausalLM", "dtype": "float16", "logits_dtype": "float32",
    "num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096, "intermediate_size": 11008,
    "num_key_value_heads": 32, "vocab_size": 32000, "position_embedding_type": "rope_gpt_neox",
    "max_position_embeddings": 2048, "hidden_act": "silu", "rotary_base": 10000.0, "rotary_scaling": None,
    "norm_epsilon": 1e-06, "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
    "mapping": {"world_size": 1, "tp_size": 1, "pp_size": 1},
    "use_parallel_embedding": False, "embedding_sharding_dim": 0, "model_type": "llama",
}
VICUNA_7B_MEDUSA = {**VICUNA_7B, "architecture": "MedusaForCausalLM", "max_draft_len": 63, "num_medusa_heads": 4,
                    "num_medusa_layers": 1}
# TensorRT-LLM examples/eagle/convert_checkpoint.py: examples/eagle/convert_checkpoint.py for EAGLE-Vicuna-7B-v1.3.
VICUNA_7B_EAGLE = {**VICUNA_7B, "architecture": "EagleForCausalLM", "max_draft_len": 63, "num_eagle_layers": 4,
                   "max_non_leaves_per_layer": 10, "head_dim": 128, "head_size": 128,
                   "eagle_net_config": {**VICUNA_7B, "num_hidden_layers": 1, "head_dim": 128, "head_size": 128}}
# Llama-3.1-8B(-Instruct): GQA 8 KV heads, 128256 vocab, llama3 rope scaling, bfloat16.
LLAMA_31_8B = {
    **VICUNA_7B, "dtype": "bfloat16", "intermediate_size": 14336, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 131072, "rotary_base": 500000.0, "norm_epsilon": 1e-05, "head_dim": 128,
    "head_size": 128, "rotary_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 8192, "rope_type": "llama3",
                                         "type": "llama3"},
}
# Llama-3.2-1B: the draft of the draft-target pair (same tokenizer and vocabulary as Llama-3.1-8B).
LLAMA_32_1B = {**LLAMA_31_8B, "num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
               "num_attention_heads": 32, "head_dim": 64, "head_size": 64,
               "rotary_scaling": {**LLAMA_31_8B["rotary_scaling"], "factor": 32.0}}

CONFIGS = {"vicuna-7b": VICUNA_7B, "vicuna-7b-medusa": VICUNA_7B_MEDUSA, "vicuna-7b-eagle": VICUNA_7B_EAGLE,
           "llama-3.1-8b": LLAMA_31_8B, "llama-3.2-1b": LLAMA_32_1B}


def write_config_checkpoint(root: Path, name: str, *, weights: bool = False, **overrides) -> Path:
    """root/name/config.json (+ empty rank files when weights=True, enough for the build's file checks)."""
    out = Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    config = {**CONFIGS[name], **overrides}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if weights:
        for rank in range(config["mapping"]["world_size"]):
            (out / f"rank{rank}.safetensors").write_bytes(b"")
    return out


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("trtllm-ckpts")
    return {name: write_config_checkpoint(root, name, weights=True) for name in CONFIGS}


# ---- a stand-in for trtllm-build (this machine has no GPU and no tensorrt_llm) --------------------------

SPEC_MODE_BITS = {None: 1, "draft_tokens_external": 2, "medusa": 4, "lookahead_decoding": 8,
                  "explicit_draft_tokens": 16, "eagle": 32}


def fake_trtllm_build(argv, cwd, *, version="1.2.1", tamper=None):
    """Write what trtllm-build writes (config.json + rank{r}.engine) by applying builder.build()'s documented
    adjustments (TensorRT-LLM tensorrt_llm/builder.py) to the flags it was given; `tamper` edits the result."""
    assert argv[0] == "trtllm-build"
    flags = dict(zip(argv[1::2], argv[2::2]))
    ckpt = json.loads((Path(flags["--checkpoint_dir"]) / "config.json").read_text())
    mode = flags.get("--speculative_decoding_mode")
    k = int(flags.get("--max_draft_len", 0)) or ckpt.get("max_draft_len", 0) if mode else 0  # the checkpoint's K unless given
    if "redrafter_num_beams" in ckpt:  # a ReDrafter checkpoint: K = beams x length, the mode forced
        mode, k = "explicit_draft_tokens", ckpt["redrafter_num_beams"] * ckpt["redrafter_draft_len_per_beam"]
    batch, seq_len = int(flags["--max_batch_size"]), int(flags["--max_seq_len"])
    if mode:
        seq_len += k  # the draft slots
    if mode == "eagle":
        seq_len += ckpt["num_eagle_layers"]  # and EAGLE's layers
        assert batch <= 512 and k <= 256  # builder.build()'s EAGLE limits
    num_tokens = max(int(flags["--max_num_tokens"]), batch * (k + 1)) if mode else int(flags["--max_num_tokens"])
    build_config = {"max_input_len": int(flags["--max_input_len"]), "max_seq_len": seq_len, "max_batch_size": batch,
                    "max_beam_width": 1, "max_num_tokens": num_tokens, "max_draft_len": k,
                    "speculative_decoding_mode": SPEC_MODE_BITS[mode], "kv_cache_type": "PAGED",
                    "plugin_config": {"gemm_plugin": flags["--gemm_plugin"], "gpt_attention_plugin": "auto",
                                      "use_paged_context_fmha": flags.get("--use_paged_context_fmha") == "enable"
                                      or mode == "eagle"}}
    config = {"version": version, "pretrained_config": ckpt, "build_config": build_config}
    if tamper:
        tamper(config)
    out = Path(flags["--output_dir"])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(ckpt["mapping"]["world_size"]):
        (out / f"rank{rank}.engine").write_bytes(b"engine")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    from trtspec.testing.tokenizers import write_tiny_tokenizer

    out = tmp_path_factory.mktemp("tokenizer")
    write_tiny_tokenizer(out)
    return out


def build_engine(source: Path, out: Path, tokenizer: Path, *, version: str = "1.2.1", **options):
    """`trtspec build --backend trtllm` with the stand-in runner: plan, "run", check, manifest."""
    from trtspec.engine.trtllm_builder import build
    from trtspec.engine.trtllm_plan import TrtllmBuildOptions

    opts = TrtllmBuildOptions(source=source, out=out, tokenizer=tokenizer, trtllm_version=version,
                              **{"max_batch_size": 4, **options})
    return build(opts, runner=lambda argv, cwd: fake_trtllm_build(argv, cwd, version=version))


# helpers as fixtures: with --import-mode=importlib test modules cannot import conftest
@pytest.fixture(scope="session")
def write_ckpt():
    return write_config_checkpoint


@pytest.fixture(scope="session")
def engine_builder():
    return build_engine


@pytest.fixture(scope="session")
def fake_build():
    return fake_trtllm_build
