"""Tests for the tiny random checkpoint factory: names, shapes, dtypes and configs of every format."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from trtspec.testing import (
    TinyModel,
    write_eagle3_draft,
    write_eagle_draft,
    write_example,
    write_hf_base,
    write_medusa_heads,
)
from trtspec.testing.__main__ import main

GQA = TinyModel()
H, V, I, L = GQA.hidden_size, GQA.vocab_size, GQA.intermediate_size, GQA.num_layers


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Load every tensor of one safetensors file."""
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def read_state(path: Path) -> dict[str, torch.Tensor]:
    """Load a checkpoint folder's tensors, whatever its storage."""
    if (path / "model.safetensors.index.json").exists():
        index = json.loads((path / "model.safetensors.index.json").read_text())
        return {k: v for name in sorted(set(index["weight_map"].values()))
                for k, v in read_safetensors(path / name).items()}
    if (path / "model.safetensors").exists():
        return read_safetensors(path / "model.safetensors")
    return torch.load(path / "pytorch_model.bin", weights_only=True)


def read_json(path: Path) -> dict:
    """Load a JSON file."""
    return json.loads(path.read_text())


def shapes_of(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    """Return key -> shape."""
    return {k: tuple(v.shape) for k, v in state.items()}


def expected_layer(m: TinyModel, p: str, *, input_norm: bool = True) -> dict[str, tuple[int, ...]]:
    """Spell out one decoder layer's HF shapes (the test oracle)."""
    q, kv, h, i = m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.hidden_size, m.intermediate_size
    out = {p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
           p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
           p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
           p + "post_attention_layernorm.weight": (h,)}
    if input_norm:
        out[p + "input_layernorm.weight"] = (h,)
    if m.arch == "qwen2":
        out |= {p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                p + "self_attn.v_proj.bias": (kv,)}
    return out


def expected_base(m: TinyModel) -> dict[str, tuple[int, ...]]:
    """Spell out the HF base shapes (the test oracle)."""
    out = {"model.embed_tokens.weight": (m.vocab_size, m.hidden_size), "model.norm.weight": (m.hidden_size,)}
    for i in range(m.num_layers):
        out |= expected_layer(m, f"model.layers.{i}.")
    if not m.tie_word_embeddings:
        out["lm_head.weight"] = (m.vocab_size, m.hidden_size)
    return out


# ---- TinyModel ------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("kwargs", "error"), [
    ({}, None),
    ({"arch": "qwen2", "num_kv_heads": 4}, None),
    ({"arch": "gpt2"}, "arch='gpt2'"),
    ({"dtype": "int8"}, "dtype='int8'"),
    ({"hidden_size": 66}, "not a multiple of num_heads"),
    ({"num_kv_heads": 3}, "not a multiple of num_kv_heads"),
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"vocab_size": 2.5}, "vocab_size must be a positive int"),
    ({"rope_scaling": "linear"}, "rope_scaling must be a dict"),
    ({"embedding_std": 0}, "embedding_std must be a positive number"),
])
def test_tiny_model_validation(kwargs: dict, error: str | None) -> None:
    if error is None:
        assert TinyModel(**kwargs).head_dim == 16
    else:
        with pytest.raises(ValueError, match=error):
            TinyModel(**kwargs)


# ---- HF base --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", ["safetensors", "sharded", "bin"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2"])
def test_hf_base_keys_shapes_dtype(tmp_path: Path, arch: str, storage: str) -> None:
    m = TinyModel(arch=arch, dtype="float16")
    out = write_hf_base(tmp_path / "a" / "base", m, storage=storage)
    assert out == tmp_path / "a" / "base"
    state = read_state(out)
    assert shapes_of(state) == expected_base(m)
    assert {v.dtype for v in state.values()} == {torch.float16}
    files = {p.name for p in out.iterdir()}
    weights = {"safetensors": {"model.safetensors"}, "bin": {"pytorch_model.bin"}}.get(storage)
    assert weights is None or files == {"config.json"} | weights


@pytest.mark.parametrize(("arch", "extra"), [
    ("llama", {"attention_bias": False, "mlp_bias": False}),
    ("mistral", {"sliding_window": None}),
    ("qwen2", {"use_sliding_window": False}),
])
def test_hf_base_config(tmp_path: Path, arch: str, extra: dict) -> None:
    m = TinyModel(arch=arch, rope_scaling={"rope_type": "linear", "factor": 2.0}, dtype="bfloat16")
    config = read_json(write_hf_base(tmp_path, m) / "config.json")
    name = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]
    assert config == {
        "architectures": [name], "model_type": arch, "hidden_size": H, "intermediate_size": I,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": L, "vocab_size": V,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        "max_position_embeddings": 512, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "head_dim": 16, **extra}


@pytest.mark.parametrize("num_layers", [1, 2, 5])
def test_sharded_index_is_consistent(tmp_path: Path, num_layers: int) -> None:
    m = TinyModel(num_layers=num_layers)
    out = write_hf_base(tmp_path, m, storage="sharded")
    index = read_json(out / "model.safetensors.index.json")
    names = sorted(p.name for p in out.glob("model-*.safetensors"))
    n = len(names)
    assert n >= 2 and names == [f"model-{k:05d}-of-{n:05d}.safetensors" for k in range(1, n + 1)]
    files = {name: read_safetensors(out / name) for name in names}
    assert set(index["weight_map"]) == set(expected_base(m))
    for key, name in index["weight_map"].items():
        assert key in files[name]
    assert sum(len(f) for f in files.values()) == len(index["weight_map"])  # no key stored twice
    assert index["weight_map"]["lm_head.weight"] == names[-1]
    assert index["metadata"]["total_size"] == sum(t.nbytes for f in files.values() for t in f.values())
    if num_layers > 1:
        layer_files = {index["weight_map"][f"model.layers.{i}.mlp.up_proj.weight"] for i in range(num_layers)}
        assert len(layer_files) >= 2


def test_tied_embeddings_have_no_lm_head(tmp_path: Path) -> None:
    m = TinyModel(tie_word_embeddings=True)
    for storage in ("safetensors", "sharded", "bin"):
        out = write_hf_base(tmp_path / storage, m, storage=storage)
        assert "lm_head.weight" not in read_state(out)
        assert read_json(out / "config.json")["tie_word_embeddings"] is True


def test_same_seed_same_values_across_storages(tmp_path: Path) -> None:
    states = [read_state(write_hf_base(tmp_path / s, storage=s)) for s in ("safetensors", "sharded", "bin", "streamed")]
    for state in states[1:]:
        assert all(torch.equal(state[k], states[0][k]) for k in states[0])
    other = read_state(write_hf_base(tmp_path / "seed1", seed=1))
    assert not torch.equal(other["lm_head.weight"], states[0]["lm_head.weight"])


def test_random_values_are_distinct_and_scaled(tmp_path: Path) -> None:
    state = read_state(write_hf_base(tmp_path, TinyModel(arch="qwen2")))
    a, b = state["model.layers.0.self_attn.q_proj.weight"], state["model.layers.1.self_attn.q_proj.weight"]
    assert not torch.equal(a, b)
    assert 0.015 < float(a.std()) < 0.025
    norm = state["model.layers.0.input_layernorm.weight"]
    assert abs(float(norm.mean()) - 1.0) < 0.05 and 0.05 < float(norm.std()) < 0.15
    bias = state["model.layers.0.self_attn.q_proj.bias"]
    assert float(bias.abs().max()) < 0.2 and float(bias.abs().sum()) > 0


def test_embedding_std_scales_the_vocabulary_tables_only(tmp_path: Path) -> None:
    """embedding_std sizes embed_tokens and lm_head (base and EAGLE draft), every other value stays as seeded."""
    default = read_state(write_hf_base(tmp_path / "default"))
    scaled = read_state(write_hf_base(tmp_path / "scaled", TinyModel(embedding_std=0.1), storage="sharded"))
    for key in default:
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            assert torch.allclose(scaled[key], 5 * default[key]), key
            assert 0.08 < float(scaled[key].std()) < 0.12
        else:
            assert torch.equal(scaled[key], default[key]), key
    draft = torch.load(write_eagle_draft(tmp_path / "eagle", TinyModel(embedding_std=0.1)) / "pytorch_model.bin")
    assert 0.08 < float(draft["embed_tokens.weight"].std()) < 0.12 and float(draft["fc.weight"].std()) < 0.03


def test_hf_base_rejects_unknown_storage(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage='gguf'"):
        write_hf_base(tmp_path, storage="gguf")


# ---- Medusa ---------------------------------------------------------------------------------------------

def expected_heads(n: int, layers: int, lm_head: bool, prefix: str = "") -> dict[str, tuple[int, ...]]:
    """Spell out FasterDecoding Medusa head shapes (the test oracle)."""
    out: dict[str, tuple[int, ...]] = {}
    for h in range(n):
        for j in range(layers):
            out |= {f"{prefix}{h}.{j}.linear.weight": (H, H), f"{prefix}{h}.{j}.linear.bias": (H,)}
        if lm_head:
            out[f"{prefix}{h}.{layers}.weight"] = (V, H)
    return out


def read_heads(path: Path) -> dict[str, torch.Tensor]:
    """Load a heads-only Medusa checkpoint."""
    if (path / "medusa_lm_head.pt").exists():
        return torch.load(path / "medusa_lm_head.pt", weights_only=True)
    return read_safetensors(path / "medusa_lm_head.safetensors")


@pytest.mark.parametrize(("variant", "num_heads", "num_layers", "per_head_lm_head"), [
    ("pt", 4, 1, True), ("pt", 5, 2, True), ("safetensors", 3, 1, True),
    ("safetensors", 4, 1, False), ("pt", 2, 1, False),
])
def test_medusa_heads_only(tmp_path: Path, variant: str, num_heads: int, num_layers: int,
                           per_head_lm_head: bool) -> None:
    out = write_medusa_heads(tmp_path / "m", GQA, variant=variant, num_heads=num_heads, num_layers=num_layers,
                             per_head_lm_head=per_head_lm_head)
    heads = read_heads(out)
    assert shapes_of(heads) == expected_heads(num_heads, num_layers, per_head_lm_head)
    assert {p.name for p in out.iterdir()} == {"config.json", f"medusa_lm_head.{variant}"}
    expected = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "base_model_name_or_path": "tiny-base"}
    assert read_json(out / "config.json") == expected | ({} if per_head_lm_head else {"version": "2"})


@pytest.mark.parametrize(("config", "expected"), [
    ("match", {"medusa_num_heads": 4}),
    ("mismatch", {"medusa_num_heads": 2}),
    ("alt_key", {"num_medusa_heads": 4}),
    ("no_count", {}),
    ("absent", None),
])
def test_medusa_config_cases(tmp_path: Path, config: str, expected: dict | None) -> None:
    out = write_medusa_heads(tmp_path, num_heads=4, config=config)
    assert len(expected_heads(4, 1, True)) == len(read_heads(out))  # always 4 heads stored
    if expected is None:
        assert not (out / "config.json").exists()
    else:
        assert read_json(out / "config.json") == expected | {"medusa_num_layers": 1,
                                                              "base_model_name_or_path": "tiny-base"}


def test_medusa_mismatch_single_head_keeps_one(tmp_path: Path) -> None:
    out = write_medusa_heads(tmp_path, num_heads=1, config="mismatch")
    assert read_json(out / "config.json")["medusa_num_heads"] == 1


@pytest.mark.parametrize(("variant", "prefix"), [("full_model", "medusa_head."), ("modelopt", "medusa_heads.")])
def test_medusa_full_model_variants(tmp_path: Path, variant: str, prefix: str) -> None:
    m = TinyModel(arch="mistral", dtype="bfloat16")
    out = write_medusa_heads(tmp_path / "medusa", m, variant=variant, num_heads=3)
    state = read_safetensors(out / "model.safetensors")
    assert shapes_of(state) == expected_base(m) | expected_heads(3, 1, True, prefix)
    assert {t.dtype for t in state.values()} == {torch.bfloat16}
    base = read_state(write_hf_base(tmp_path / "base", m))
    assert all(torch.equal(state[k], base[k]) for k in base)
    config = read_json(out / "config.json")
    base_config = read_json(tmp_path / "base" / "config.json")
    if variant == "full_model":
        assert config == base_config | {"medusa_num_heads": 3, "medusa_num_layers": 1}
        assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors"}
    else:
        assert config == base_config | {"medusa": {"num_medusa_heads": 3, "num_medusa_layers": 1}}
        assert read_json(out / "hf_quant_config.json") == {
            "producer": {"name": "modelopt", "version": "0.15.0"},
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None}}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("variant", ["pt", "safetensors"])
def test_medusa_dtype(tmp_path: Path, variant: str, dtype: str) -> None:
    heads = read_heads(write_medusa_heads(tmp_path, TinyModel(dtype=dtype), variant=variant))
    assert {t.dtype for t in heads.values()} == {getattr(torch, dtype)}


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"variant": "bin"}, "variant='bin'"),
    ({"config": "wrong"}, "config='wrong'"),
    ({"num_heads": 0}, "num_heads must be a positive int"),
    ({"num_layers": 0}, "num_layers must be a positive int"),
    ({"variant": "full_model", "config": "mismatch"}, "heads-only variants"),
    ({"variant": "modelopt", "config": "absent"}, "heads-only variants"),
    ({"variant": "full_model", "per_head_lm_head": False}, "legacy variant"),
])
def test_medusa_rejects_bad_arguments(tmp_path: Path, kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        write_medusa_heads(tmp_path / "m", **kwargs)
    assert not (tmp_path / "m").exists()


# ---- EAGLE-1/2 ------------------------------------------------------------------------------------------

def expected_eagle(m: TinyModel, fc_bias: bool, embed: bool, layers: int) -> dict[str, tuple[int, ...]]:
    """Spell out EAGLE-1/2 draft shapes (the test oracle)."""
    out = {"fc.weight": (m.hidden_size, 2 * m.hidden_size)}
    if fc_bias:
        out["fc.bias"] = (m.hidden_size,)
    if embed:
        out["embed_tokens.weight"] = (m.vocab_size, m.hidden_size)
    for j in range(layers):
        out |= expected_layer(m, f"layers.{j}.", input_norm=j >= 1)
    return out


@pytest.mark.parametrize(("arch", "fc_bias", "embed", "layers", "storage"), [
    ("llama", True, True, 1, "bin"), ("llama", False, False, 1, "safetensors"),
    ("qwen2", True, True, 2, "safetensors"), ("mistral", True, False, 3, "bin"),
])
def test_eagle_draft_keys_shapes(tmp_path: Path, arch: str, fc_bias: bool, embed: bool, layers: int,
                                 storage: str) -> None:
    m = TinyModel(arch=arch)
    out = write_eagle_draft(tmp_path, m, fc_bias=fc_bias, embed_tokens=embed, num_layers=layers, storage=storage)
    state = read_state(out)
    assert shapes_of(state) == expected_eagle(m, fc_bias, embed, layers)
    assert "layers.0.input_layernorm.weight" not in state
    assert ("layers.1.input_layernorm.weight" in state) == (layers > 1)
    weights = "pytorch_model.bin" if storage == "bin" else "model.safetensors"
    assert {p.name for p in out.iterdir()} == {"config.json", weights}


@pytest.mark.parametrize(("arch", "config_bias", "extra"), [
    ("llama", None, {}), ("llama", False, {"bias": False}), ("llama", True, {"bias": True}),
    ("qwen2", None, {"qkv_bias": True}),
])
def test_eagle_config(tmp_path: Path, arch: str, config_bias: bool | None, extra: dict) -> None:
    m = TinyModel(arch=arch, dtype="float16")
    config = read_json(write_eagle_draft(tmp_path, m, num_layers=2, config_bias=config_bias) / "config.json")
    assert config == {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H, "intermediate_size": I,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": V,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512, "hidden_act": "silu",
        "torch_dtype": "float16", **extra}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_eagle_dtype(tmp_path: Path, dtype: str) -> None:
    state = read_state(write_eagle_draft(tmp_path, TinyModel(dtype=dtype)))
    assert {t.dtype for t in state.values()} == {getattr(torch, dtype)}


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"storage": "pt"}, "storage='pt'"), ({"num_layers": 0}, "num_layers must be a positive int"),
])
def test_eagle_rejects_bad_arguments(tmp_path: Path, kwargs: dict, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        write_eagle_draft(tmp_path, **kwargs)


# ---- EAGLE-3 --------------------------------------------------------------------------------------------

def expected_eagle3(m: TinyModel, vd: int, embed: bool) -> dict[str, tuple[int, ...]]:
    """Spell out EAGLE-3 draft shapes (the test oracle)."""
    h, q, kv, i = m.hidden_size, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim, m.intermediate_size
    p = "midlayer."
    out = {p + "self_attn.q_proj.weight": (q, 2 * h), p + "self_attn.k_proj.weight": (kv, 2 * h),
           p + "self_attn.v_proj.weight": (kv, 2 * h), p + "self_attn.o_proj.weight": (h, q),
           p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
           p + "input_layernorm.weight": (h,), p + "hidden_norm.weight": (h,),
           p + "post_attention_layernorm.weight": (h,), "fc.weight": (h, 3 * h), "norm.weight": (h,),
           "lm_head.weight": (vd, h), "d2t": (vd,), "t2d": (m.vocab_size,)}
    return out | ({"embed_tokens.weight": (m.vocab_size, h)} if embed else {})


@pytest.mark.parametrize(("vd", "embed", "dtype"), [
    (128, False, "float32"), (256, True, "bfloat16"), (5, False, "float16"), (1, False, "float32"),
])
def test_eagle3_draft(tmp_path: Path, vd: int, embed: bool, dtype: str) -> None:
    m = TinyModel(dtype=dtype, num_heads=8, num_kv_heads=2)
    out = write_eagle3_draft(tmp_path, m, draft_vocab_size=vd, embed_tokens=embed)
    state = read_safetensors(out / "model.safetensors")
    assert len(state) == 15 + embed
    assert shapes_of(state) == expected_eagle3(m, vd, embed)
    d2t, t2d = state.pop("d2t"), state.pop("t2d")
    assert {t.dtype for t in state.values()} == {getattr(torch, dtype)}
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    target = torch.arange(vd) + d2t  # target_id = draft_id + d2t[draft_id]
    assert int(t2d.sum()) == vd and bool(t2d[target].all())
    assert bool((target[1:] > target[:-1]).all())  # sorted, hence distinct
    assert target[: min(8, vd)].tolist() == list(range(min(8, vd)))
    assert int(target.max()) < m.vocab_size
    if vd == m.vocab_size:
        assert not d2t.any()


def test_eagle3_config(tmp_path: Path) -> None:
    config = read_json(write_eagle3_draft(tmp_path, GQA, draft_vocab_size=64) / "config.json")
    assert config == {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "draft_vocab_size": 64,
        "vocab_size": V, "hidden_size": H, "intermediate_size": I, "num_attention_heads": 4,
        "num_key_value_heads": 2, "num_hidden_layers": 1, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "max_position_embeddings": 512, "hidden_act": "silu", "torch_dtype": "float32"}


def test_eagle3_is_seeded(tmp_path: Path) -> None:
    a = read_safetensors(write_eagle3_draft(tmp_path / "a") / "model.safetensors")
    b = read_safetensors(write_eagle3_draft(tmp_path / "b") / "model.safetensors")
    c = read_safetensors(write_eagle3_draft(tmp_path / "c", seed=4) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["d2t"], c["d2t"])


@pytest.mark.parametrize(("vd", "error"), [(0, "draft_vocab_size must be a positive int"),
                                           (V + 1, "exceeds vocab_size")])
def test_eagle3_rejects_bad_draft_vocab(tmp_path: Path, vd: int, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        write_eagle3_draft(tmp_path, draft_vocab_size=vd)


# ---- example and CLI ------------------------------------------------------------------------------------

def test_write_example(tmp_path: Path) -> None:
    paths = write_example(tmp_path / "ex")
    assert paths == {name: tmp_path / "ex" / name for name in ("base", "medusa", "eagle")}
    assert read_json(paths["base"] / "config.json")["num_key_value_heads"] < 4  # GQA
    assert read_json(paths["medusa"] / "config.json")["medusa_num_heads"] < len(
        {k.split(".")[0] for k in read_heads(paths["medusa"])})
    assert (paths["eagle"] / "pytorch_model.bin").exists()


def test_main_prints_paths(tmp_path: Path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"{name}\t{tmp_path / name}" for name in ("base", "medusa", "eagle")]
