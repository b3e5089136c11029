"""The EAGLE drafter of a converted checkpoint against an independent build from transformers' LlamaDecoderLayer
over the SOURCE draft tensors (yuhuili layout), for prefill and incremental steps; corrupted EagleNet copies.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from torch import nn
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from trtspec import CheckpointError, ConvertOptions, convert
from trtspec.model.eagle_draft import EagleDraftModel
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base

FP32_TOL = 1e-5  # max abs diff vs the transformers-built draft, both float32 (observed <= 1e-6)
TINY = TinyModel()


class HfDraft:
    """EAGLE-1 `cnets` rebuilt from transformers parts: fc(cat(embed, feature)) → LlamaDecoderLayers (layer 0 with
    an Identity input_layernorm) → base lm_head. Full-sequence causal attention, no cache."""

    def __init__(self, base_dir, draft_dir):
        src = torch.load(draft_dir / "pytorch_model.bin", weights_only=True)
        base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32, local_files_only=True)
        config = transformers.LlamaConfig.from_pretrained(draft_dir)
        config._attn_implementation = "eager"
        self.embed = src.get("embed_tokens.weight", base.model.embed_tokens.weight.detach())  # else a base copy
        self.fc_weight, self.fc_bias = src["fc.weight"], src.get("fc.bias")
        self.lm_head = base.lm_head.weight.detach()
        self.rotary = LlamaRotaryEmbedding(config)
        self.layers = []
        for j in range(config.num_hidden_layers):
            layer = LlamaDecoderLayer(config, layer_idx=j)
            if j == 0:
                layer.input_layernorm = nn.Identity()  # EAGLE's first layer has none
            prefix = f"layers.{j}."
            layer.load_state_dict({k.removeprefix(prefix): v.float() for k, v in src.items() if k.startswith(prefix)})
            self.layers.append(layer.eval())

    def __call__(self, ids, features):
        """ids [B, S], features [B, S, H] → (hidden [B, S, H], logits [B, S, V])."""
        S = ids.shape[1]
        x = F.linear(torch.cat([F.embedding(ids, self.embed), features], dim=-1), self.fc_weight, self.fc_bias)
        pos = torch.arange(S)[None].expand_as(ids)
        cos_sin = self.rotary(x, pos)
        mask = torch.full((S, S), torch.finfo(torch.float32).min).triu(1)[None, None]  # [1, 1, S, S] additive
        for layer in self.layers:
            x = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
        return x, x @ self.lm_head.T


@pytest.fixture(scope="module", autouse=True)
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    return write_hf_base(tmp_path_factory.mktemp("hf"), TINY)


def convert_eagle(root, base, *, num_eagle_layers=3, tp_size=1, **draft_kwargs):
    draft = write_eagle_draft(root / "draft", TINY, storage="bin", **draft_kwargs)
    convert(ConvertOptions(base=base, out=root / "trt", eagle=draft, num_eagle_layers=num_eagle_layers,
                           tp_size=tp_size), show_progress=False)
    return draft, root / "trt"


def causal(batch, new, past=0):
    mask = torch.cat([torch.ones(new, past, dtype=torch.bool), torch.ones(new, new, dtype=torch.bool).tril()], 1)
    return mask.expand(batch, new, past + new)


def assert_close(actual, expected, tol, what):
    d = (actual.float() - expected.float()).abs().max().item()
    assert d <= tol, f"{what}: max abs diff {d:.3g} exceeds tolerance {tol:g}"


@pytest.mark.parametrize("num_layers, fc_bias, embed_tokens, tp_size", [
    (2, True, True, 1),  # layer 1 has an input_layernorm, layer 0 not
    (1, False, False, 2),  # "bias": false (LLaMA3-style: TRT-LLM gets a zero fc.bias), base embedding, 2 ranks
])
def test_draft_matches_transformers_layers_prefill_and_incremental(tmp_path, base_dir, num_layers, fc_bias,
                                                                  embed_tokens, tp_size):
    draft_dir, ckpt = convert_eagle(tmp_path, base_dir, num_layers=num_layers, fc_bias=fc_bias, config_bias=fc_bias,
                                    embed_tokens=embed_tokens, tp_size=tp_size)
    model, reference = EagleDraftModel.from_checkpoint(ckpt), HfDraft(base_dir, draft_dir)
    assert model.config.num_layers == num_layers and model.config.vocab_size == TINY.vocab_size
    gen = torch.Generator().manual_seed(0)
    B, S = 2, 11
    ids = torch.randint(0, TINY.vocab_size, (B, S), generator=gen)
    features = torch.randn(B, S, TINY.hidden_size, generator=gen)
    with torch.no_grad():
        exp_hidden, exp_logits = reference(ids, features)
        past, done = model.empty_cache(B), 0
        for T in (8, 1, 2):  # prefill, then two incremental steps
            sl = slice(done, done + T)
            pos = torch.arange(done, done + T)[None].expand(B, T)
            out = model(ids[:, sl], features[:, sl], pos, causal(B, T, done), *past)
            assert_close(out.hidden, exp_hidden[:, sl], FP32_TOL, f"draft hidden, tokens {done}..{done + T - 1}")
            assert_close(out.logits, exp_logits[:, sl], FP32_TOL, f"draft logits, tokens {done}..{done + T - 1}")
            assert out.logits.dtype == torch.float32 and out.new_key.shape == (num_layers, B, 2, T, TINY.head_dim)
            past = tuple(torch.cat([p, n], dim=3) for p, n in zip(past, (out.new_key, out.new_value)))
            done += T


def rewrite_rank0(ckpt, edit):
    path = ckpt / "rank0.safetensors"
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    tensors = safetensors.torch.load_file(path)
    edit(tensors)
    safetensors.torch.save_file(tensors, path, metadata=metadata)


def perturb(name):
    def edit(tensors):
        tensors[name] = tensors[name] + 1e-3
    return edit


def drop(name):
    return lambda tensors: tensors.pop(name)


def as_base(ckpt):
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps(config | {"architecture": "LlamaForCausalLM"}))


@pytest.mark.parametrize("corrupt, message", [
    (lambda c: rewrite_rank0(c, perturb("eagle_nets.1.drafter.layers.1.mlp.fc.weight")),
     r"eagle_nets\.1\.drafter\.layers\.1\.mlp\.fc\.weight differs from eagle_nets\.0"),
    (lambda c: rewrite_rank0(c, perturb("eagle_nets.2.lm_head.weight")), r"eagle_nets\.2\.lm_head\.weight differs"),
    (lambda c: rewrite_rank0(c, drop("eagle_nets.2.drafter.fc.bias")), r"eagle_nets\.0\.drafter\.fc\.bias has no twin"),
    (as_base, "not EagleForCausalLM"),
], ids=["copy_differs", "lm_head_copy_differs", "copy_missing_tensor", "not_eagle"])
def test_corrupted_checkpoint_is_rejected_naming_the_tensor(tmp_path, base_dir, corrupt, message):
    _, ckpt = convert_eagle(tmp_path, base_dir, num_layers=2)
    EagleDraftModel.from_checkpoint(ckpt)  # intact: loads
    corrupt(ckpt)
    with pytest.raises(CheckpointError, match=message):
        EagleDraftModel.from_checkpoint(ckpt)
