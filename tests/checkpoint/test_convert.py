"""Conversion into TensorRT-LLM checkpoints: reference names, shapes and config fields, and bit-exact round trips."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch

from trtspec import ConvertOptions, convert, read_trtllm_checkpoint
from trtspec.checkpoint.tensorfile import open_hf_weights
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

# TRT-LLM layer suffix → HF layer suffix, written out from tensorrt_llm/models/llama/convert.py (TensorRT-LLM tensorrt_llm/models/llama/convert.py, docs/upstream-sources.md),
# independently of the converter's own rename table.
LAYER_REFERENCE = {
    "input_layernorm.weight": "input_layernorm.weight",
    "attention.dense.weight": "self_attn.o_proj.weight",
    "post_layernorm.weight": "post_attention_layernorm.weight",
    "mlp.fc.weight": "mlp.gate_proj.weight",
    "mlp.gate.weight": "mlp.up_proj.weight",
    "mlp.proj.weight": "mlp.down_proj.weight",
}


def _convert(tmp_path, base, name="ckpt", **kwargs):
    out = tmp_path / name
    convert(ConvertOptions(base=base, out=out, **kwargs), show_progress=False)
    return out


def _hf_state(directory):
    store = open_hf_weights(directory)
    return {k: store.load(k) for k in store.keys()}


def _expected_base_names(m: TinyModel, *, layers=None, tp=1) -> dict[str, tuple[int, ...]]:
    """Per-rank names and shapes of the reference table for a LLaMA base."""
    H, hd, V, I = m.hidden_size, m.head_dim, m.vocab_size, m.intermediate_size
    kv_rank = max(m.num_kv_heads, tp) // tp
    names = {"transformer.vocab_embedding.weight": (V, H), "transformer.ln_f.weight": (H,),
             "lm_head.weight": (-(-V // tp), H)}
    for i in layers if layers is not None else range(m.num_layers):
        p = f"transformer.layers.{i}."
        names.update({
            p + "input_layernorm.weight": (H,), p + "post_layernorm.weight": (H,),
            p + "attention.qkv.weight": ((m.num_heads // tp + 2 * kv_rank) * hd, H),
            p + "attention.dense.weight": (H, m.num_heads * hd // tp),
            p + "mlp.fc.weight": (I // tp, H), p + "mlp.gate.weight": (I // tp, H), p + "mlp.proj.weight": (H, I // tp),
        })
    return names


def _rank_shapes(ckpt_dir, rank):
    tensors = safetensors.torch.load_file(ckpt_dir / f"rank{rank}.safetensors")  # the official reader
    return {k: tuple(v.shape) for k, v in tensors.items()}


@pytest.mark.parametrize("tp", [1, 2])
def test_medusa_names_shapes_and_config_match_reference(tmp_path, tp):
    m = TinyModel()
    base = write_hf_base(tmp_path / "base", m)
    heads = write_medusa_heads(tmp_path / "medusa", m, num_heads=3)
    out = _convert(tmp_path, base, medusa=heads, tp_size=tp, max_draft_len=15)
    H, V = m.hidden_size, m.vocab_size
    expected = _expected_base_names(m, tp=tp)
    for h in range(3):
        expected[f"medusa_heads.{h}.medusa_layers.0.linear.weight"] = (H // tp, H)
        expected[f"medusa_heads.{h}.medusa_layers.0.linear.bias"] = (H // tp,)
        expected[f"medusa_heads.{h}.lm_head.weight"] = (V // tp, H)
    for rank in range(tp):
        assert _rank_shapes(out, rank) == expected
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "MedusaForCausalLM"
    assert (cfg["num_medusa_heads"], cfg["num_medusa_layers"], cfg["max_draft_len"]) == (3, 1, 15)
    assert cfg["mapping"] == {"world_size": tp, "tp_size": tp, "pp_size": 1}
    assert cfg["position_embedding_type"] == "rope_gpt_neox"
    assert cfg["quantization"] == {"quant_algo": None, "kv_cache_quant_algo": None}
    assert (cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"]) == (
        H, m.num_heads, m.num_kv_heads, V)
    assert (cfg["dtype"], cfg["logits_dtype"], cfg["hidden_act"]) == ("float32", "float32", "silu")
    assert cfg["rotary_base"] == m.rope_theta and cfg["norm_epsilon"] == m.rms_norm_eps


@pytest.mark.parametrize("tp", [1, 2])
def test_eagle_names_shapes_and_config_match_reference(tmp_path, tp):
    m = TinyModel()
    base = write_hf_base(tmp_path / "base", m)
    draft = write_eagle_draft(tmp_path / "eagle", m)
    out = _convert(tmp_path, base, eagle=draft, tp_size=tp, num_eagle_layers=3, max_non_leaves_per_layer=5,
                   max_draft_len=25)
    H, V, I, hd = m.hidden_size, m.vocab_size, m.intermediate_size, m.head_dim
    kv_rank = max(m.num_kv_heads, tp) // tp
    expected = _expected_base_names(m, tp=tp)
    for k in range(3):
        p = f"eagle_nets.{k}."
        expected.update({
            p + "drafter.vocab_embedding.weight": (V, H),
            p + "drafter.fc.weight": (H // tp, 2 * H), p + "drafter.fc.bias": (H // tp,),
            p + "drafter.layers.0.attention.qkv.weight": ((m.num_heads // tp + 2 * kv_rank) * hd, H),
            p + "drafter.layers.0.attention.dense.weight": (H, H // tp),
            p + "drafter.layers.0.post_layernorm.weight": (H,),  # layer 0: no input_layernorm
            p + "drafter.layers.0.mlp.fc.weight": (I // tp, H), p + "drafter.layers.0.mlp.gate.weight": (I // tp, H),
            p + "drafter.layers.0.mlp.proj.weight": (H, I // tp),
            p + "lm_head.weight": (V // tp, H),
        })
    for rank in range(tp):
        assert _rank_shapes(out, rank) == expected
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "EagleForCausalLM"
    assert (cfg["num_eagle_layers"], cfg["max_non_leaves_per_layer"], cfg["max_draft_len"]) == (3, 5, 25)
    net = cfg["eagle_net_config"]
    assert net["architecture"] == "LlamaForCausalLM" and net["num_hidden_layers"] == 1
    assert (net["vocab_size"], net["rotary_base"], net["hidden_act"]) == (V, m.rope_theta, "silu")
    assert net["mapping"] == cfg["mapping"]


def test_eagle_draft_vocabulary_travels_beside_the_rank_files(tmp_path):
    """An EAGLE-1 draft with d2t / t2d: the rank files are the same as without (trtllm-build never sees the map),
    draft_vocab.safetensors carries it, and it reads back as the same target ids."""
    from trtspec.checkpoint.draft_vocab import CHECKPOINT_FILE, read_checkpoint_vocab

    m = TinyModel()
    base = write_hf_base(tmp_path / "base", m)
    plain = write_eagle_draft(tmp_path / "plain", m, storage="safetensors")
    reduced = write_eagle_draft(tmp_path / "reduced", m, storage="safetensors", draft_vocab_size=40)
    a, b = _convert(tmp_path, base, "a", eagle=plain), _convert(tmp_path, base, "b", eagle=reduced)
    assert (a / "rank0.safetensors").read_bytes() == (b / "rank0.safetensors").read_bytes()
    assert not (a / CHECKPOINT_FILE).exists() and read_checkpoint_vocab(a, m.vocab_size) is None
    vocab = read_checkpoint_vocab(b, m.vocab_size)
    src = _hf_state(reduced)
    assert vocab.size == 40 and list(vocab.target_ids) == (torch.arange(40) + src["d2t"]).tolist()
    assert list(vocab.target_ids[:8]) == list(range(8)) and (vocab.target_ids[1:] > vocab.target_ids[:-1]).all()
    from trtspec.checkpoint.convert import PROVENANCE_FILE

    assert json.loads((b / PROVENANCE_FILE).read_text())["eagle"]["draft_vocab_size"] == 40


def _check_base_roundtrip(ckpt, src, m: TinyModel):
    assert torch.equal(ckpt.tensor("transformer.vocab_embedding.weight"), src["model.embed_tokens.weight"])
    assert torch.equal(ckpt.tensor("transformer.ln_f.weight"), src["model.norm.weight"])
    lm = src["model.embed_tokens.weight"] if m.tie_word_embeddings else src["lm_head.weight"]
    assert torch.equal(ckpt.tensor("lm_head.weight"), lm)
    for i in range(m.num_layers):
        trt, hf = f"transformer.layers.{i}.", f"model.layers.{i}."
        q, k, v = ckpt.split_qkv(trt + "attention.qkv.weight")
        for got, key in ((q, "q_proj"), (k, "k_proj"), (v, "v_proj")):
            assert torch.equal(got, src[f"{hf}self_attn.{key}.weight"]), (i, key)
        if m.arch == "qwen2":
            q, k, v = ckpt.split_qkv(trt + "attention.qkv.bias")
            assert torch.equal(torch.cat([q, k, v]), torch.cat(
                [src[f"{hf}self_attn.{p}.bias"] for p in ("q_proj", "k_proj", "v_proj")]))
        for trt_suffix, hf_suffix in LAYER_REFERENCE.items():
            assert torch.equal(ckpt.tensor(trt + trt_suffix), src[hf + hf_suffix]), (i, trt_suffix)


@pytest.mark.parametrize("model", [
    TinyModel(),
    TinyModel(num_kv_heads=4),  # MHA
    TinyModel(tie_word_embeddings=True),
    TinyModel(arch="mistral"),
    TinyModel(arch="qwen2", vocab_size=250),  # q/k/v biases; vocab not divisible by 4
    TinyModel(num_kv_heads=1, num_layers=4),  # KV heads duplicated for tp > 1
], ids=["llama-gqa", "llama-mha", "llama-tied", "mistral", "qwen2-v250", "mqa-4layers"])
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2)])
def test_base_roundtrip_is_bit_exact(tmp_path, model, tp, pp):
    base = write_hf_base(tmp_path / "base", model)
    out = _convert(tmp_path, base, tp_size=tp, pp_size=pp)
    ckpt = read_trtllm_checkpoint(out)
    assert sorted(p.name for p in out.glob("rank*.safetensors")) == [f"rank{r}.safetensors" for r in range(tp * pp)]
    _check_base_roundtrip(ckpt, _hf_state(base), model)
    assert set(ckpt.names()) == set(_expected_base_names(model)) | (
        {f"transformer.layers.{i}.attention.qkv.bias" for i in range(model.num_layers)} if model.arch == "qwen2" else set())


@pytest.mark.parametrize("storage", ["safetensors", "sharded", "bin"])
def test_every_storage_format_converts_identically(tmp_path, storage):
    base = write_hf_base(tmp_path / "base", TinyModel(), storage=storage)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, base, tp_size=2))
    _check_base_roundtrip(ckpt, _hf_state(base), TinyModel())


def test_pipeline_stages_hold_their_layers(tmp_path):
    m = TinyModel(num_layers=4)
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", m), pp_size=2)
    first, last = _rank_shapes(out, 0), _rank_shapes(out, 1)
    assert "transformer.vocab_embedding.weight" in first and "lm_head.weight" not in first
    assert "lm_head.weight" in last and "transformer.ln_f.weight" in last
    assert "transformer.vocab_embedding.weight" not in last
    for stage in (first, last):  # layers are numbered locally within each stage
        assert {k.split(".")[2] for k in stage if k.startswith("transformer.layers.")} == {"0", "1"}


def test_vocab_padding_is_zero_and_dropped_on_read(tmp_path):
    m = TinyModel(vocab_size=250)
    out = _convert(tmp_path, write_hf_base(tmp_path / "base", m), tp_size=4)
    last = safetensors.torch.load_file(out / "rank3.safetensors")["lm_head.weight"]
    assert last.shape == (63, m.hidden_size)  # pad_vocab_size(250, 4) / 4
    assert torch.count_nonzero(last[-2:]) == 0  # 252 - 250 padded rows
    assert read_trtllm_checkpoint(out).tensor("lm_head.weight").shape == (250, m.hidden_size)


@pytest.mark.parametrize("variant,config", [("pt", "match"), ("pt", "mismatch"), ("pt", "alt_key"),
                                            ("pt", "no_count"), ("pt", "absent"), ("safetensors", "match")])
@pytest.mark.parametrize("tp", [1, 2])
def test_medusa_heads_roundtrip(tmp_path, variant, config, tp):
    m = TinyModel()
    base = write_hf_base(tmp_path / "base", m)
    heads_dir = write_medusa_heads(tmp_path / "medusa", m, variant=variant, config=config, num_heads=4)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, base, medusa=heads_dir, tp_size=tp))
    assert ckpt.config["num_medusa_heads"] == 4  # the stored heads decide, whatever config.json says
    src = (safetensors.torch.load_file(heads_dir / "medusa_lm_head.safetensors") if variant == "safetensors"
           else torch.load(heads_dir / "medusa_lm_head.pt"))
    for h in range(4):
        p = f"medusa_heads.{h}."
        assert torch.equal(ckpt.tensor(p + "medusa_layers.0.linear.weight"), src[f"{h}.0.linear.weight"])
        assert torch.equal(ckpt.tensor(p + "medusa_layers.0.linear.bias"), src[f"{h}.0.linear.bias"])
        assert torch.equal(ckpt.tensor(p + "lm_head.weight"), src[f"{h}.1.weight"])


@pytest.mark.parametrize("variant,prefix", [("full_model", "medusa_head."), ("modelopt", "medusa_heads.")])
def test_medusa_embedded_in_model_folder(tmp_path, variant, prefix):
    m = TinyModel()
    folder = write_medusa_heads(tmp_path / "model", m, variant=variant, num_heads=2, num_layers=2)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, folder, medusa=folder, tp_size=2))
    src = _hf_state(folder)
    assert (ckpt.config["num_medusa_heads"], ckpt.config["num_medusa_layers"]) == (2, 2)
    for h in range(2):
        for layer in range(2):
            assert torch.equal(ckpt.tensor(f"medusa_heads.{h}.medusa_layers.{layer}.linear.weight"),
                               src[f"{prefix}{h}.{layer}.linear.weight"])
        assert torch.equal(ckpt.tensor(f"medusa_heads.{h}.lm_head.weight"), src[f"{prefix}{h}.2.weight"])
    _check_base_roundtrip(ckpt, src, m)


def test_embedded_heads_without_medusa_flag_convert_the_base_only(tmp_path):
    folder = write_medusa_heads(tmp_path / "model", TinyModel(), variant="full_model")
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, folder))
    assert ckpt.architecture == "LlamaForCausalLM"
    assert not any(n.startswith("medusa_heads.") for n in ckpt.names())


def test_heads_only_medusa_reuses_base_lm_head(tmp_path):
    m = TinyModel(vocab_size=250)
    base = write_hf_base(tmp_path / "base", m)
    heads_dir = write_medusa_heads(tmp_path / "medusa", m, variant="safetensors", per_head_lm_head=False)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, base, medusa=heads_dir, tp_size=4))
    for h in range(4):
        assert torch.equal(ckpt.tensor(f"medusa_heads.{h}.lm_head.weight"), _hf_state(base)["lm_head.weight"])
    assert ckpt.config["num_medusa_heads"] == 4


def test_fewer_medusa_heads_than_stored_takes_the_first(tmp_path):
    m = TinyModel()
    heads_dir = write_medusa_heads(tmp_path / "medusa", m, num_heads=4)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, write_hf_base(tmp_path / "base", m), medusa=heads_dir,
                                           num_medusa_heads=2))
    assert ckpt.config["num_medusa_heads"] == 2
    assert {n.split(".")[1] for n in ckpt.names() if n.startswith("medusa_heads.")} == {"0", "1"}


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("draft_layers,storage", [(1, "bin"), (2, "safetensors")])
def test_eagle_roundtrip_copies_draft_per_eagle_layer(tmp_path, tp, draft_layers, storage):
    m = TinyModel()
    base = write_hf_base(tmp_path / "base", m)
    draft_dir = write_eagle_draft(tmp_path / "eagle", m, num_layers=draft_layers, storage=storage)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, base, eagle=draft_dir, num_eagle_layers=2, tp_size=tp))
    src, base_src = _hf_state(draft_dir), _hf_state(base)
    assert ckpt.config["eagle_net_config"]["num_hidden_layers"] == draft_layers
    for k in range(2):
        p = f"eagle_nets.{k}."
        assert torch.equal(ckpt.tensor(p + "drafter.vocab_embedding.weight"), src["embed_tokens.weight"])
        assert torch.equal(ckpt.tensor(p + "drafter.fc.weight"), src["fc.weight"])
        assert torch.equal(ckpt.tensor(p + "drafter.fc.bias"), src["fc.bias"])
        assert torch.equal(ckpt.tensor(p + "lm_head.weight"), base_src["lm_head.weight"])
        for j in range(draft_layers):
            q, kk, v = ckpt.split_qkv(f"{p}drafter.layers.{j}.attention.qkv.weight")
            assert torch.equal(kk, src[f"layers.{j}.self_attn.k_proj.weight"])
            for trt_suffix, hf_suffix in LAYER_REFERENCE.items():
                name = f"{p}drafter.layers.{j}.{trt_suffix}"
                if j == 0 and trt_suffix == "input_layernorm.weight":
                    assert name not in ckpt
                else:
                    assert torch.equal(ckpt.tensor(name), src[f"layers.{j}.{hf_suffix}"])


@pytest.mark.parametrize("src_dtype,out_dtype", [("float32", "float16"), ("float32", "bfloat16"),
                                                 ("bfloat16", "float32"), ("float16", None)])
def test_dtype_casts(tmp_path, src_dtype, out_dtype):
    m = TinyModel(dtype=src_dtype)
    base = write_hf_base(tmp_path / "base", m)
    ckpt = read_trtllm_checkpoint(_convert(tmp_path, base, dtype=out_dtype, tp_size=2))
    expected = out_dtype or src_dtype  # default: the base's stored dtype
    assert ckpt.config["dtype"] == expected
    got = ckpt.tensor("transformer.layers.1.mlp.fc.weight")
    ref = _hf_state(base)["model.layers.1.mlp.gate_proj.weight"].to(getattr(torch, expected))
    assert got.dtype == getattr(torch, expected) and torch.equal(got, ref)


def test_output_appears_only_when_complete(tmp_path):
    base = write_hf_base(tmp_path / "base", TinyModel())
    out = _convert(tmp_path, base)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "rank0.safetensors", "trtspec-convert.json"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    provenance = json.loads((out / "trtspec-convert.json").read_text())
    assert provenance["base_architecture"] == "LlamaForCausalLM"
