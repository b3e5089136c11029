"""The reference network against Hugging Face transformers, on tiny checkpoints of every base format converted by
trtspec: prefill, incremental decoding, a tree step, padded cache slots, Medusa heads; plus config and RoPE parity.
"""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from trtspec import CheckpointError, ConfigError, ConvertOptions, convert, read_trtllm_checkpoint
from trtspec.checkpoint.model_shape import ModelShape
from trtspec.model.reference import ReferenceModel
from trtspec.model.rope import rope_inv_freq
from trtspec.testing import add_llama_biases, TinyModel, write_hf_base, write_medusa_heads

FP32_TOL = 1e-5  # max abs logit diff vs HF, both float32 (observed <= 3e-7; a 1% RoPE frequency error gives 1.5e-4)
SELF_TOL = 1e-5  # max abs difference between two runs of the reference model itself
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

# case → (tiny model, convert options); "llama_biases" adds attention (q/k/v/o) and MLP biases to a LLaMA.
CASES = {
    "llama_gqa": (TinyModel(), {}),
    "llama_mha": (TinyModel(num_kv_heads=4), {}),
    "tied_embeddings": (TinyModel(tie_word_embeddings=True), {}),
    "mistral": (TinyModel(arch="mistral"), {}),
    "qwen2_biases": (TinyModel(arch="qwen2"), {}),
    "llama_biases": (TinyModel(), {}),
    "llama3_rope": (TinyModel(rope_scaling=LLAMA3, max_position_embeddings=512), {}),
    "float16": (TinyModel(dtype="float16"), {}),
    "bfloat16": (TinyModel(dtype="bfloat16"), {}),
    "kv1_tp2": (TinyModel(num_kv_heads=1), {"tp_size": 2}),  # KV heads duplicated per rank, folded back on read
}
TREE = [[0], [1], [0, 0], [0, 1], [1, 0]]  # medusa_choices-style paths below the root


@pytest.fixture(scope="module", autouse=True)
def offline():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield


def load_hf(folder) -> transformers.PreTrainedModel:
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True,
                                                              attn_implementation="eager")
    return model.eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """case → (ReferenceModel, HF model), built once per module."""
    cache = {}

    def get(case):
        if case not in cache:
            tiny, opts = CASES[case]
            root = tmp_path_factory.mktemp(case)
            base = write_hf_base(root / "hf", tiny)
            if case == "llama_biases":
                add_llama_biases(base)
            convert(ConvertOptions(base=base, out=root / "trt", **opts), show_progress=False)
            cache[case] = ReferenceModel.from_checkpoint(root / "trt"), load_hf(base), root
        return cache[case]
    return get


def causal_mask(batch: int, new: int, past: int = 0) -> torch.Tensor:
    """[B, T, P+T]: every past column visible, new columns lower-triangular."""
    return torch.cat([torch.ones(new, past, dtype=torch.bool), torch.ones(new, new, dtype=torch.bool).tril()],
                     dim=1).expand(batch, new, past + new)


def positions(batch: int, new: int, past: int = 0) -> torch.Tensor:
    return torch.arange(past, past + new).expand(batch, new)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def assert_close(actual, expected, tol, what):
    d = max_diff(actual, expected)
    assert d <= tol, f"{what}: max abs diff {d:.3g} exceeds tolerance {tol:g}"


def random_ids(batch, length, vocab, seed=0):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def step(model, ids, past=None, pos=None, mask=None):
    B, T = ids.shape
    pk, pv = past if past is not None else model.empty_cache(B)
    P = pk.shape[3]
    pos = positions(B, T, P) if pos is None else pos
    mask = causal_mask(B, T, P) if mask is None else mask
    return model(ids, pos, mask, pk, pv)


def extend(past, out):
    return torch.cat([past[0], out.new_key], dim=3), torch.cat([past[1], out.new_value], dim=3)


# ---- (1) prefill, (2) incremental decoding, (3) tree step: every base format ----------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_prefill_logits_match_hf(models, case):
    ref, hf, _ = models(case)
    ids = random_ids(3, 12, ref.config.vocab_size)
    with torch.no_grad():
        out, expected = step(ref, ids), hf(ids).logits
    assert out.logits.dtype == torch.float32 and out.logits.shape == expected.shape
    assert_close(out.logits, expected, FP32_TOL, f"{case} prefill logits")


@pytest.mark.parametrize("case", list(CASES))
def test_incremental_decoding_matches_hf_full_sequence(models, case):
    ref, hf, _ = models(case)
    ids = random_ids(2, 14, ref.config.vocab_size, seed=1)
    with torch.no_grad():
        full = hf(ids).logits  # [B, 14, V]
        prefill = step(ref, ids[:, :10])
        past = extend(ref.empty_cache(2), prefill)
        one = step(ref, ids[:, 10:11], past)  # T = 1
        three = step(ref, ids[:, 11:14], extend(past, one))  # T = 3
    assert_close(one.logits, full[:, 10:11], FP32_TOL, f"{case} decode T=1")
    assert_close(three.logits, full[:, 11:14], FP32_TOL, f"{case} decode T=3")


def tree_buffers(choices):
    """Root + nodes: (parent index per slot, depth per slot, ancestor mask [n+1, n+1] including self)."""
    index = {(): 0} | {tuple(c): i + 1 for i, c in enumerate(choices)}
    parents = [-1] + [index[tuple(c[:-1])] for c in choices]
    mask = torch.eye(len(index), dtype=torch.bool)
    for slot, parent in enumerate(parents):
        while parent >= 0:
            mask[slot, parent] = True
            parent = parents[parent]
    return parents, [0] + [len(c) for c in choices], mask


def root_paths(parents):
    paths = []
    for slot in range(len(parents)):
        path = [slot]
        while parents[path[0]] >= 0:
            path.insert(0, parents[path[0]])
        paths.append(path)
    return paths


@pytest.mark.parametrize("case", list(CASES))
def test_tree_step_matches_hf_on_each_root_to_node_path(models, case):
    ref, hf, _ = models(case)
    P = 9
    prompt = random_ids(1, P, ref.config.vocab_size, seed=2)
    parents, depth, tree_mask = tree_buffers(TREE)
    tokens = random_ids(1, len(parents), ref.config.vocab_size, seed=3)  # root + arbitrary draft tokens
    mask = torch.cat([torch.ones(len(parents), P, dtype=torch.bool), tree_mask], dim=1)[None]  # [1, n+1, P+n+1]
    with torch.no_grad():
        past = extend(ref.empty_cache(1), step(ref, prompt))
        out = step(ref, tokens, past, pos=P + torch.tensor([depth]), mask=mask)
        for slot, path in enumerate(root_paths(parents)):
            expected = hf(torch.cat([prompt, tokens[:, path]], dim=1)).logits[:, -1]
            assert_close(out.logits[:, slot], expected, FP32_TOL, f"{case} tree slot {slot} (path {path})")


# ---- (5) padded cache slots ---------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["llama_gqa", "qwen2_biases"])
def test_padded_cache_slots_equal_each_sequence_alone(models, case):
    ref, _, _ = models(case)
    lengths, P, T = (5, 8), 8, 3
    prompts = [random_ids(1, n, ref.config.vocab_size, seed=10 + n) for n in lengths]
    new = random_ids(2, T, ref.config.vocab_size, seed=4)
    with torch.no_grad():
        alone, pasts = [], []
        for b, prompt in enumerate(prompts):
            past = extend(ref.empty_cache(1), step(ref, prompt))
            pasts.append(past)
            alone.append(step(ref, new[b:b + 1], past))
        garbage = torch.Generator().manual_seed(5)

        def pad(t):  # padding slots hold garbage: only the mask may keep them out
            fill = torch.randn(*t.shape[:3], P - t.shape[3], t.shape[4], generator=garbage)
            return torch.cat([t, fill], dim=3)
        past_key = torch.cat([pad(p[0]) for p in pasts], dim=1)  # [L, 2, nkv, P, hd]
        past_value = torch.cat([pad(p[1]) for p in pasts], dim=1)
        mask = causal_mask(2, T, P).clone()
        pos = torch.stack([torch.arange(n, n + T) for n in lengths])
        for b, n in enumerate(lengths):
            mask[b, :, n:P] = False
        batched = ref(new, pos, mask, past_key, past_value)
    for b in range(2):
        assert_close(batched.logits[b], alone[b].logits[0], SELF_TOL, f"{case} padded batch row {b} logits")
        assert_close(batched.new_key[:, b], alone[b].new_key[:, 0], SELF_TOL, f"{case} padded batch row {b} keys")


def test_fully_masked_row_gives_no_nan(models):
    ref, _, _ = models("llama_gqa")
    ids = random_ids(1, 4, ref.config.vocab_size)
    mask = causal_mask(1, 4).clone()
    mask[0, 2] = False  # never happens in normal use (a slot always sees itself), but must not poison the batch
    with torch.no_grad():
        out = step(ref, ids, mask=mask)
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.new_key).all()



def test_mismatched_step_inputs_are_named(models):
    ref, _, _ = models("llama_gqa")
    ids = random_ids(1, 4, ref.config.vocab_size)
    with pytest.raises(ValueError, match=r"attention_mask has shape \[1, 4, 5\], expected \[1, 4, 4\]"):
        step(ref, ids, mask=torch.ones(1, 4, 5, dtype=torch.bool))

# ---- (4) Medusa heads -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant, per_head_lm_head, num_layers",
                         [("pt", True, 1), ("safetensors", False, 1), ("pt", True, 2)])
def test_medusa_logits_match_source_heads_on_hf_hidden(tmp_path, variant, per_head_lm_head, num_layers):
    tiny = TinyModel()
    base = write_hf_base(tmp_path / "hf", tiny)
    heads_dir = write_medusa_heads(tmp_path / "medusa", tiny, variant=variant, num_heads=3, num_layers=num_layers,
                                   per_head_lm_head=per_head_lm_head)
    convert(ConvertOptions(base=base, out=tmp_path / "trt", medusa=heads_dir, num_medusa_heads=3,
                           num_medusa_layers=num_layers), show_progress=False)
    ref, hf = ReferenceModel.from_checkpoint(tmp_path / "trt"), load_hf(base)
    src = (torch.load(heads_dir / "medusa_lm_head.pt", weights_only=True) if variant == "pt"
           else safetensors.torch.load_file(heads_dir / "medusa_lm_head.safetensors"))
    ids = random_ids(2, 7, tiny.vocab_size, seed=6)
    with torch.no_grad():
        hf_out = hf(ids, output_hidden_states=True)
        out = step(ref, ids)
        final = hf_out.hidden_states[-1]  # [B, T, H]
        # transformers 5 ties hidden_states[-1] to last_hidden_state, i.e. AFTER model.norm: lm_head(it) is logits.
        assert_close(hf.lm_head(final), hf_out.logits, 0.0, "HF hidden_states[-1] is post-norm")
        expected = []
        for h in range(3):
            x = final
            for layer in range(num_layers):
                x = x + F.silu(x @ src[f"{h}.{layer}.linear.weight"].T + src[f"{h}.{layer}.linear.bias"])
            lm = src[f"{h}.{num_layers}.weight"] if per_head_lm_head else hf.lm_head.weight  # heads-only: base lm_head
            expected.append(x @ lm.T)
    assert out.medusa_logits.shape == (3, 2, 7, tiny.vocab_size) and out.medusa_logits.dtype == torch.float32
    assert_close(out.hidden, final, FP32_TOL, "hidden vs HF hidden_states[-1]")
    assert_close(out.medusa_logits, torch.stack(expected), FP32_TOL, f"medusa logits ({variant})")


def test_plain_base_has_no_medusa_logits(models):
    ref, _, _ = models("llama_gqa")
    with torch.no_grad():
        assert step(ref, random_ids(1, 3, ref.config.vocab_size)).medusa_logits is None


def test_reader_object_and_compute_dtype(models):
    _, hf, root = models("float16")
    ref = ReferenceModel.from_checkpoint(read_trtllm_checkpoint(root / "trt"), dtype=torch.bfloat16)
    ids = random_ids(1, 6, ref.config.vocab_size)
    with torch.no_grad():
        out, expected = step(ref, ids), hf(ids).logits
    assert ref.config.dtype == "float16" and out.new_key.dtype == torch.bfloat16 and out.logits.dtype == torch.float32
    assert_close(out.logits, expected, 0.05, "bfloat16 compute vs HF float32")


# ---- config and RoPE ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trt_config(models):
    return json.loads((models("llama_gqa")[2] / "trt" / "config.json").read_text())


@pytest.mark.parametrize("patch, expected", [
    ({}, {"architecture": "LlamaForCausalLM", "num_kv_heads": 2, "head_dim": 16, "qkv_bias": False, "o_bias": False}),
    ({"attn_bias": True}, {"qkv_bias": True, "o_bias": True}),  # LLaMA attention_bias: q/k/v and dense
    ({"architecture": "Qwen2ForCausalLM", "attn_bias": True, "qwen_type": "qwen2"},
     {"qkv_bias": True, "o_bias": False}),  # Qwen2: q/k/v only
    ({"architecture": "MedusaForCausalLM", "qwen_type": "qwen2", "attn_bias": True, "num_medusa_heads": 4,
      "num_medusa_layers": 1, "max_draft_len": 63}, {"o_bias": False, "num_medusa_heads": 4, "max_draft_len": 63}),
    ({"rotary_scaling": {"type": "linear", "factor": 2.0}}, {"rope_scaling": {"type": "linear", "factor": 2.0}}),
    ({"num_key_value_heads": None, "head_size": None, "head_dim": None}, {"num_kv_heads": 4, "head_dim": 16}),
    ({"hidden_size": None}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"architecture": "GPT2LMHeadModel"}, "architecture"),
    ({"attn_bias": "yes"}, "attn_bias"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"dtype": "int8"}, "dtype"),
    ({"rotary_base": -1}, "rotary_base"),
    ({"num_key_value_heads": 3}, "num_key_value_heads=3"),
    ({"architecture": "MedusaForCausalLM", "num_medusa_heads": 4, "max_draft_len": 63}, "num_medusa_layers"),
    ({"architecture": "EagleForCausalLM", "num_eagle_layers": 4, "max_non_leaves_per_layer": 10,
      "max_draft_len": 63}, "eagle_net_config"),
])
def test_model_config_from_trtllm(trt_config, patch, expected):
    config = trt_config | patch
    if isinstance(expected, str):
        with pytest.raises(CheckpointError, match=expected):
            ModelShape.from_trtllm(config)
        return
    got = ModelShape.from_trtllm(config)
    assert {k: getattr(got, k) for k in expected} == expected


LLAMA3_TRT = {"type": "llama3", **{k: v for k, v in LLAMA3.items() if k != "rope_type"}}  # TRT-LLM spelling


@pytest.mark.parametrize("scaling, hf_rope", [
    (None, {"rope_type": "default"}),
    ({"rope_type": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}),
    (LLAMA3, LLAMA3),
    (LLAMA3_TRT, LLAMA3),
])
def test_rope_inv_freq_equals_hf(scaling, hf_rope):
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=512,
                                      rope_parameters=hf_rope | {"rope_theta": 500000.0})
    default = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding.compute_default_rope_parameters
    expected, _ = ROPE_INIT_FUNCTIONS.get(hf_rope["rope_type"], default)(config)
    assert torch.equal(rope_inv_freq(16, 500000.0, scaling), expected), "inv_freq must be bit-identical to HF"


@pytest.mark.parametrize("scaling, message", [({"rope_type": "yarn", "factor": 2.0}, "'yarn'"),
                                              ({"type": "linear"}, "'factor'")])
def test_rope_inv_freq_rejects_unsupported_scaling(scaling, message):
    with pytest.raises(ConfigError, match=message):
        rope_inv_freq(16, 10000.0, scaling)


def test_leftover_tensor_is_named(tmp_path):
    base = write_hf_base(tmp_path / "hf", TinyModel(arch="qwen2"))
    convert(ConvertOptions(base=base, out=tmp_path / "trt"), show_progress=False)
    config = json.loads((tmp_path / "trt" / "config.json").read_text())
    (tmp_path / "trt" / "config.json").write_text(json.dumps(config | {"attn_bias": False}))
    with pytest.raises(CheckpointError, match=r"transformer\.layers\.0\.attention\.qkv\.bias"):
        ReferenceModel.from_checkpoint(tmp_path / "trt")
