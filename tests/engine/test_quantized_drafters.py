"""Every drafter × every quantized weight format builds: Medusa heads, EAGLE-1 and EAGLE-2 drafts with and without a
reduced draft vocabulary, ReDrafter drafters with and without an input projection, at int8, int4 symmetric, int4 min and with an lm_head of its own format (--lm-head-weights),
each passing the build's check against the reference computing with the same dequantized weights.

The tiny checkpoints are laid out as a real one is where that matters: a tied target (SmolLM2's), EAGLE drafts without
an embedding of their own (the converter gives them the target's, so a draft's embedding equals its lm_head, as the
shipped SmolLM2 drafter's does), embeddings that weigh in the EAGLE `fc` beside the feature as a trained model's do,
and a hidden size of 3 blocks of 32, so that at block size 64 a block of the `fc` straddles its two input halves
[token embedding ‖ feature] and the embedding's rows end in a padded block."""

from __future__ import annotations

import pytest

from trtspec.checkpoint.convert import ConvertOptions, convert
from trtspec.engine.manifest import WeightFormat
from trtspec.engine.onnx_builder import NUMERICS_TOLERANCE, BuildOptions, build
from trtspec.speculative.tree import DynamicTree
from trtspec.testing import TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads, write_redrafter_drafter

# head_dim 32 (GroupQueryAttention's multiple of 16); hidden 96 = 3 blocks of 32 = 1.5 blocks of 64
MODEL = TinyModel(hidden_size=96, num_layers=1, num_heads=3, num_kv_heads=1, intermediate_size=128, vocab_size=64,
                  tie_word_embeddings=True, max_position_embeddings=128, embedding_std=0.1)
DRAFT_VOCAB = 24
CHAIN = "[[0],[0,0]]"
# drafter → (checkpoint, build options)
DRAFTERS = {
    "medusa": ("medusa", {"choices": CHAIN}),
    "eagle": ("eagle", {"choices": CHAIN}),
    "eagle-draft-vocab": ("eagle-draft-vocab", {"choices": CHAIN}),
    "eagle2": ("eagle", {"dynamic_tree": DynamicTree(depth=2, top_k=2, total_tokens=3)}),
    "eagle2-draft-vocab": ("eagle-draft-vocab", {"dynamic_tree": DynamicTree(depth=2, top_k=2, total_tokens=3)}),
    "redrafter": ("redrafter", {}),  # exit_dim 2 x hidden (no input_proj), with the recurrence
    "redrafter-proj": ("redrafter-proj", {}),  # exit_dim 64 through input_proj, no recurrence
}
FORMATS = {
    "int8-b64": {"weights": "int8", "block_size": 64},  # the fc's middle block straddles its halves
    "int4": {"weights": "int4"},
    "int4-min": {"weights": "int4", "int4_scheme": "min"},
    "int4-lm-head-int8": {"weights": "int4", "lm_head_weights": "int8"},
}


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized-drafters")
    base = write_hf_base(root / "base", MODEL)
    drafters = {"medusa": {"medusa": write_medusa_heads(root / "heads", MODEL, num_heads=2, per_head_lm_head=False)},
                "eagle": {"eagle": write_eagle_draft(root / "eagle", MODEL, embed_tokens=False)},
                "eagle-draft-vocab": {"eagle": write_eagle_draft(root / "eagle-vocab", MODEL, embed_tokens=False,
                                                                 storage="safetensors",
                                                                 draft_vocab_size=DRAFT_VOCAB)},
                "redrafter": {"redrafter": write_redrafter_drafter(root / "redrafter", MODEL)},
                "redrafter-proj": {"redrafter": write_redrafter_drafter(root / "redrafter-proj", MODEL, rnn=False,
                                                                        exit_dim=64)}}
    out = {}
    for name, drafter in drafters.items():
        out[name] = root / f"ckpt-{name}"
        beams = {"redrafter_num_beams": 2, "redrafter_draft_len_per_beam": 2} if "redrafter" in drafter else {
            "num_eagle_layers": 2}
        convert(ConvertOptions(base=base, out=out[name], **beams, **drafter), show_progress=False)
    return out


def _format(options: dict, which: str) -> WeightFormat:
    dtype = options.get("lm_head_weights", options["weights"]) if which == "lm_head" else options["weights"]
    scheme = options.get("int4_scheme", "symmetric") if dtype == "int4" else "symmetric"
    return WeightFormat(dtype=dtype, block_size=options.get("block_size", 32), accuracy_level=4, scheme=scheme)


@pytest.mark.parametrize("fmt", list(FORMATS))
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_every_drafter_builds_in_every_weight_format(ckpts, tmp_path, drafter, fmt):
    ckpt, extra = DRAFTERS[drafter]
    options = FORMATS[fmt]
    m = build(BuildOptions(source=ckpts[ckpt], out=tmp_path / "e", max_input_len=16, max_seq_len=40,
                           **extra, **options))
    draft_graphs = (("medusa",) if drafter == "medusa" else ("redrafter",) if drafter.startswith("redrafter")
                    else ("draft_context", "draft_generation"))
    checked = {role for role in m.numerics for graph in draft_graphs if role.startswith(f"{graph}.")}
    assert checked and max(m.numerics.values()) < NUMERICS_TOLERANCE, m.numerics
    assert (m.weights.linear, m.weights.lm_head, m.weights.drafter) == (_format(options, "linear"),
                                                                        _format(options, "lm_head"),
                                                                        _format(options, "drafter"))
    # the tied target's embedding gathers the quantized lm_head's rows where they are whole blocks
    whole_blocks = MODEL.hidden_size % options.get("block_size", 32) == 0
    assert m.weights.embedding == (_format(options, "lm_head") if whole_blocks else WeightFormat())
    assert m.model.draft_vocab_size == (DRAFT_VOCAB if drafter.endswith("draft-vocab") else 0)


def test_the_reference_embeds_as_the_exported_graph_does(ckpts, tmp_path):
    """A draft with a reduced vocabulary whose checkpoint ties its embedding to its lm_head: the graph keeps the fp32
    table (its lm_head holds the draft vocabulary's rows only), the tied target gathers the quantized lm_head's rows;
    the reference follows each graph, not the checkpoint's tying."""
    import numpy as np

    from trtspec.checkpoint.trtllm_reader import read_trtllm_checkpoint
    from trtspec.model.eagle_draft import EagleDraftModel
    from trtspec.model.onnx_check import dequantize_reference
    from trtspec.model.onnx_graph import WeightPlan, export_graphs
    from trtspec.model.quantize import QuantSpec, fake_quantize

    ckpt = read_trtllm_checkpoint(ckpts["eagle-draft-vocab"])
    table = ckpt.tensor("eagle_nets.0.drafter.vocab_embedding.weight").float().numpy()
    assert np.array_equal(table, ckpt.tensor("eagle_nets.0.lm_head.weight").float().numpy())  # tied in the checkpoint
    spec = QuantSpec("int4")
    graphs = export_graphs(ckpt, tmp_path, max_positions=40, weights=WeightPlan(spec, spec, spec))
    assert graphs["context"].embeds_quantized_lm_head and graphs["generation"].embeds_quantized_lm_head
    assert not graphs["draft_context"].embeds_quantized_lm_head
    assert not graphs["draft_generation"].embeds_quantized_lm_head
    for from_lm_head, expected in ((False, table), (True, fake_quantize(table, 4, 32))):
        draft = EagleDraftModel.from_checkpoint(ckpts["eagle-draft-vocab"])
        dequantize_reference(draft, spec, None, spec, embedding_from_lm_head=from_lm_head)
        assert np.array_equal(draft.vocab_embedding.weight.detach().numpy(), expected)
        assert np.array_equal(draft.lm_head.weight.detach().numpy(), fake_quantize(table, 4, 32))
