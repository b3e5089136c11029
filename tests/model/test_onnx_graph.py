"""The exported ONNX graphs against the torch reference on tiny checkpoints of every format: a causal prompt
batch, a tree step over a past, a padded batch; the static-K shape, the shared weight file, the checker, and
the torch-free import of the module.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from trtspec import BuildError, ConvertOptions, convert, read_trtllm_checkpoint
from trtspec.model.eagle_draft import EagleDraftModel
from trtspec.model.onnx_graph import (check_graph, compare_with_reference, export_graphs, max_diffs,
                                      reference_outputs, session_options)
from trtspec.model.reference import ReferenceModel
from trtspec.testing import add_llama_biases, TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

TOL = 1e-4  # max abs diff, ONNX Runtime vs the torch reference, both float32 (observed <= 1e-6)
K = 3  # generation graphs take K + 1 = 4 slots
TREE_PARENTS = [-1, 0, 0, 1]  # root, two children of the root, one grandchild: depths 0, 1, 1, 2
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

# case → (tiny model, drafter: None | ("medusa", kwargs) | ("eagle", kwargs))
CASES = {
    "llama_gqa": (TinyModel(), None),
    "llama_mha": (TinyModel(num_kv_heads=4), None),
    "tied_embeddings": (TinyModel(tie_word_embeddings=True), None),
    "qwen2_biases": (TinyModel(arch="qwen2"), None),
    "llama_biases": (TinyModel(), None),  # attention_bias (q/k/v and o) and mlp_bias
    "llama3_rope": (TinyModel(rope_scaling=LLAMA3, max_position_embeddings=512), None),
    "float16": (TinyModel(dtype="float16"), None),
    "medusa_per_head": (TinyModel(), ("medusa", {"num_heads": 3, "num_layers": 2})),
    "medusa_heads_only": (TinyModel(tie_word_embeddings=True),
                          ("medusa", {"num_heads": 2, "variant": "safetensors", "per_head_lm_head": False})),
    "eagle_1_layer": (TinyModel(), ("eagle", {"num_layers": 1})),
    "eagle_2_layers": (TinyModel(num_kv_heads=1), ("eagle", {"num_layers": 2})),
}


class Exported:
    """One converted tiny checkpoint, its exported graphs, ONNX Runtime sessions and reference models."""

    def __init__(self, root, case):
        tiny, drafter = CASES[case]
        base = write_hf_base(root / "hf", tiny)
        if case == "llama_biases":
            add_llama_biases(base)
        opts = {}
        if drafter and drafter[0] == "medusa":
            heads = write_medusa_heads(root / "medusa", tiny, **drafter[1])
            opts = {"medusa": heads, "num_medusa_heads": drafter[1]["num_heads"],
                    "num_medusa_layers": drafter[1].get("num_layers", 1)}
        elif drafter:
            opts = {"eagle": write_eagle_draft(root / "eagle", tiny, **drafter[1]), "num_eagle_layers": 2}
        self.ckpt_dir, self.out = root / "trt", root / "onnx"
        convert(ConvertOptions(base=base, out=self.ckpt_dir, **opts), show_progress=False)
        self.graphs = export_graphs(read_trtllm_checkpoint(self.ckpt_dir), self.out, generation_tokens=K + 1)
        self.models = {"": ReferenceModel.from_checkpoint(self.ckpt_dir)}
        if "draft_context" in self.graphs:
            self.models["draft_"] = EagleDraftModel.from_checkpoint(self.ckpt_dir)
        self._sessions = {}

    def session(self, role: str) -> ort.InferenceSession:
        if role not in self._sessions:
            self._sessions[role] = ort.InferenceSession(str(self.graphs[role].path), session_options(1))
        return self._sessions[role]

    def run(self, role: str, feeds) -> dict[str, np.ndarray]:
        session = self.session(role)
        return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cache = {}

    def get(case) -> Exported:
        if case not in cache:
            cache[case] = Exported(tmp_path_factory.mktemp(case), case)
        return cache[case]
    return get


def feeds_for(config, rng, ids, positions, mask, past_len, *, features=False) -> dict[str, np.ndarray]:
    """Graph feeds with a random past [P, B, nkv, hd] per layer (what is masked out is garbage)."""
    B, T = ids.shape
    feeds = {"input_ids": ids, "position_ids": positions, "attention_mask": mask}
    if features:
        feeds["features"] = rng.standard_normal((B, T, config.hidden_size), dtype=np.float32)
    for layer in range(config.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng.standard_normal((past_len, B, config.num_kv_heads, config.head_dim),
                                                                dtype=np.float32)
    return feeds


def tree_mask() -> tuple[np.ndarray, np.ndarray]:
    """Ancestor-or-self mask [K+1, K+1] and depths of TREE_PARENTS."""
    mask, depth = np.eye(len(TREE_PARENTS), dtype=bool), np.zeros(len(TREE_PARENTS), np.int64)
    for slot, parent in enumerate(TREE_PARENTS):
        if parent >= 0:
            mask[slot] |= mask[parent]
            depth[slot] = depth[parent] + 1
    return mask, depth


def assert_matches_reference(ex: Exported, role: str, feeds, what: str) -> dict[str, np.ndarray]:
    ours = ex.run(role, feeds)
    for name, diff in max_diffs(ours, reference_outputs(ex.models[role.removesuffix("context").removesuffix(
            "generation")], feeds)).items():
        assert diff <= TOL, f"{what}: {role} output {name} differs from the reference by {diff:.3g} > {TOL:g}"
    return ours


def roles(ex: Exported, kind: str) -> list[str]:
    return [r for r in ex.graphs if r.endswith(kind)]


# ---- numerics: (a) prompt batch, (b) tree step over a past, (c) padded batch -------------------------------

@pytest.mark.parametrize("case", list(CASES))
def test_graphs_pass_checker(exported, case):
    ex = exported(case)
    drafter = CASES[case][1][0] if CASES[case][1] else None
    expected = {"context", "generation"} | ({"draft_context", "draft_generation"} if drafter == "eagle" else set()) | (
        {"medusa"} if drafter == "medusa" else set())
    assert set(ex.graphs) == expected
    for graph in ex.graphs.values():
        check_graph(graph.path)


@pytest.mark.parametrize("case", list(CASES))
def test_context_graph_on_prompt_batch(exported, case):
    ex = exported(case)
    rng = np.random.default_rng(0)
    for role in roles(ex, "context"):
        c, T = ex.models[role.removesuffix("context")].config, 9
        causal = np.broadcast_to(np.tril(np.ones((T, T), bool)), (2, T, T))
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, T)), np.broadcast_to(np.arange(T), (2, T)),
                          causal, 0, features=role.startswith("draft_"))
        out = assert_matches_reference(ex, role, feeds, f"{case} prompt batch")
        assert out["logits"].shape == (2, T, c.vocab_size) and out["new_key_0"].shape == (T, 2, c.num_kv_heads,
                                                                                           c.head_dim)
        if CASES[case][1] and CASES[case][1][0] == "medusa":
            assert_medusa_heads_match_reference(ex, out["hidden"][0], CASES[case][1][1]["num_heads"], case)


def assert_medusa_heads_match_reference(ex: Exported, hidden: np.ndarray, num_heads: int, what: str) -> None:
    """The Medusa graph over T hidden states equals the reference heads (ResBlocks + lm_head) on them."""
    import torch

    (ours,) = ex.session("medusa").run(None, {"hidden": hidden})
    with torch.no_grad():
        ref = torch.stack([head(torch.from_numpy(hidden)) for head in ex.models[""].medusa_heads]).numpy()
    assert ours.shape == (num_heads, *hidden.shape[:-1], ex.models[""].config.vocab_size)
    diff = float(np.abs(ours - ref).max())
    assert diff <= TOL, f"{what}: medusa_logits differ from the reference by {diff:.3g} > {TOL:g}"


@pytest.mark.parametrize("case", list(CASES))
def test_generation_graph_on_tree_step(exported, case):
    ex = exported(case)
    rng = np.random.default_rng(1)
    tree, depth = tree_mask()
    P = 7
    for role in roles(ex, "generation"):
        c = ex.models[role.removesuffix("generation")].config
        mask = np.ones((2, K + 1, P + K + 1), bool)
        mask[:, :, P:] = tree
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, K + 1)), np.broadcast_to(P + depth, (2, K + 1)),
                          mask, P, features=role.startswith("draft_"))
        assert_matches_reference(ex, role, feeds, f"{case} tree step")


@pytest.mark.parametrize("case", ["llama_gqa", "qwen2_biases", "eagle_2_layers"])
def test_padded_batch_row_equals_row_alone(exported, case):
    ex = exported(case)
    rng = np.random.default_rng(2)
    tree, depth = tree_mask()
    lengths, P = (7, 4), 7  # row 1's past columns 4..6 are padding
    for role in roles(ex, "generation"):
        c = ex.models[role.removesuffix("generation")].config
        mask = np.ones((2, K + 1, P + K + 1), bool)
        mask[:, :, P:] = tree
        mask[1, :, lengths[1]:P] = False
        positions = np.asarray(lengths)[:, None] + depth
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, K + 1)), positions, mask, P,
                          features=role.startswith("draft_"))
        batched = assert_matches_reference(ex, role, feeds, f"{case} padded batch")
        alone = {k: v[1:2] if v.ndim > 1 and k not in ("attention_mask",) else v for k, v in feeds.items()}
        for layer_input in [k for k in feeds if k.startswith("past_")]:
            alone[layer_input] = np.ascontiguousarray(feeds[layer_input][:lengths[1], 1:2])
        alone["attention_mask"] = np.concatenate([mask[1:2, :, :lengths[1]], mask[1:2, :, P:]], axis=-1)
        single = ex.run(role, alone)
        for name, value in single.items():
            row = batched[name][:, 1:2] if name.startswith(("new_", "medusa")) else batched[name][1:2]
            diff = float(np.abs(row - value).max())
            assert diff <= 1e-5, f"{case} {role} {name}: padded row vs row alone differ by {diff:.3g} > 1e-5"


def test_fully_masked_row_reads_zero_like_the_reference(exported):
    ex = exported("llama_gqa")
    rng = np.random.default_rng(3)
    c = ex.models[""].config
    mask = np.ones((1, K + 1, 2 + K + 1), bool)
    mask[0, 2] = False  # a slot that sees nothing: the reference reads 0 there, not NaN
    feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (1, K + 1)), np.arange(K + 1)[None] + 2, mask, 2)
    out = assert_matches_reference(ex, "generation", feeds, "fully masked row")
    assert all(np.isfinite(v).all() for v in out.values())


# ---- the static-K profile, the weight file, the checker, the import -----------------------------------------

def test_generation_graph_has_static_tokens(exported):
    ex = exported("eagle_1_layer")
    for role in ("generation", "draft_generation"):
        model = onnx.load(str(ex.graphs[role].path), load_external_data=False)
        dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
                for v in [*model.graph.input, *model.graph.output]}
        assert dims["input_ids"] == ["batch", K + 1] and dims["attention_mask"] == ["batch", K + 1, "past_plus_tokens"]
        assert dims["past_key_0"] == ["past", "batch", 2, 16] and dims["new_value_0"] == [K + 1, "batch", 2, 16]
    context = onnx.load(str(ex.graphs["context"].path), load_external_data=False)
    assert context.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "tokens"
    c, T = ex.models[""].config, K + 2
    feeds = feeds_for(c, np.random.default_rng(4), np.zeros((1, T), np.int64), np.arange(T)[None],
                      np.ones((1, T, T), bool), 0)
    with pytest.raises(ort.capi.onnxruntime_pybind11_state.InvalidArgument,
                       match=r"invalid dimensions for input: \w+ids for the following indices\n index: 1 Got: 5 Expected: 4"):
        ex.run("generation", feeds)
    assert ex.run("context", feeds)["logits"].shape == (1, T, c.vocab_size)


@pytest.mark.parametrize("case, stored_once", [("llama_gqa", 0), ("tied_embeddings", 1), ("medusa_heads_only", 3)])
def test_weights_are_written_once(exported, case, stored_once):
    """Both base graphs point into one weights.bin holding each float32 weight once (a tied embedding and the
    heads-only Medusa lm_heads are the base lm_head, stored once: `stored_once` copies of [V, H] saved)."""
    ex = exported(case)
    entries = {}
    for role in ("context", "generation"):
        model = onnx.load(str(ex.graphs[role].path), load_external_data=False)
        external = {t.name: {e.key: e.value for e in t.external_data} for t in model.graph.initializer
                    if t.data_location == onnx.TensorProto.EXTERNAL}
        assert {e["location"] for e in external.values()} == {"weights.bin"}
        assert all(t.data_location == onnx.TensorProto.EXTERNAL or len(t.raw_data) < 4096
                   for t in model.graph.initializer), "weights must not be inlined in the graph"
        entries[role] = external
    assert entries["context"] == entries["generation"]
    c = ex.models[""].config
    ref_bytes = 4 * sum(p.numel() for p in ex.models[""].parameters())
    stored = 4 * c.vocab_size * c.hidden_size * stored_once
    size = (ex.out / "weights.bin").stat().st_size
    assert ref_bytes - stored <= size <= ref_bytes - stored + 64 * len(entries["context"]), \
        f"weights.bin is {size} bytes; the float32 weights stored once take {ref_bytes - stored}"
    medusa = ["medusa.onnx"] if "medusa" in ex.graphs else []
    assert sorted(p.name for p in ex.out.iterdir()) == ["context.onnx", "generation.onnx", *medusa, "weights.bin"]


def test_eagle_draft_has_its_own_weight_file(exported):
    ex = exported("eagle_2_layers")
    model = onnx.load(str(ex.graphs["draft_context"].path), load_external_data=False)
    assert {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"} == \
        {"draft_weights.bin"}
    assert ex.graphs["draft_generation"].inputs[:4] == ("input_ids", "features", "position_ids", "attention_mask")
    assert ex.graphs["draft_generation"].outputs[:2] == ("logits", "hidden")


def test_compare_with_reference_names_every_output(exported):
    ex = exported("eagle_1_layer")
    diffs = compare_with_reference(ex.ckpt_dir, ex.out, ex.graphs)
    assert set(diffs) == {f"{role}.{name}" for role in ex.graphs
                          for name in ("logits", "hidden", "new_key", "new_value")}
    assert max(diffs.values()) <= TOL, f"compare_with_reference: {diffs} exceeds {TOL:g}"


@pytest.mark.parametrize("tokens, error", [(1, None), (0, "positive int"), (True, "positive int")])
def test_generation_tokens(tmp_path, exported, tokens, error):
    ckpt = read_trtllm_checkpoint(exported("llama_gqa").ckpt_dir)
    if error:
        with pytest.raises(BuildError, match=error):
            export_graphs(ckpt, tmp_path, generation_tokens=tokens)
        return
    graphs = export_graphs(ckpt, tmp_path, generation_tokens=tokens)
    check_graph(graphs["generation"].path)


def test_check_graph_names_the_broken_file(tmp_path, exported):
    model = onnx.load(str(exported("llama_gqa").graphs["context"].path), load_external_data=False)
    model.graph.node[5].input[0] = "no_such_tensor"
    onnx.save_model(model, str(tmp_path / "context.onnx"))
    (tmp_path / "weights.bin").write_bytes((exported("llama_gqa").out / "weights.bin").read_bytes())
    with pytest.raises(BuildError, match=r"context\.onnx: not a valid ONNX graph"):
        check_graph(tmp_path / "context.onnx")


@pytest.mark.parametrize("threads, expected", [(1, 1), (3, 3), (None, os.cpu_count())])
def test_session_options(threads, expected):
    options = session_options(threads)
    assert options.intra_op_num_threads == expected and options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"


def test_module_imports_without_torch():
    code = "import sys, trtspec.model.onnx_graph; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", "importing trtspec.model.onnx_graph must not import torch"


@pytest.mark.parametrize("case", ["llama_gqa", "tied_embeddings", "eagle_2_layers"])
def test_graphs_read_the_cache_in_place_with_fused_ops(exported, case):
    """Per layer the graph stays small: the cache and the new K/V reach attention only through FusedMatMul (no
    Transpose copies of the past), each residual Add is fused into the next norm, and a vocabulary matrix is
    used [V, H] (the embedding rows are gathered along axis 0, never column by column)."""
    ex = exported(case)
    for role in [r for r in ex.graphs if "context" in r or "generation" in r]:
        graph = onnx.load(str(ex.graphs[role].path), load_external_data=False).graph
        layers = sum(1 for i in graph.input if i.name.startswith("past_key_"))
        consumers = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        for layer in range(layers):
            for kind in ("key", "value"):
                past = {n.op_type for n in consumers[f"past_{kind}_{layer}"]}
                assert past <= {"FusedMatMul", "Shape"}, (role, kind)
                assert {n.op_type for n in consumers[f"new_{kind}_{layer}"]} == {"FusedMatMul"}, (role, kind)
        ops = [n.op_type for n in graph.node]
        # per layer the attention's mask Add and past + new Add; the residual Adds are fused into the norms
        assert ops.count("Add") <= 2 * layers + 2, f"{role}: residual Adds not fused into the norms"
        assert all(n.attribute[0].i == 0 for n in graph.node if n.op_type == "Gather"), role
        assert len(graph.node) <= 32 * layers + 30, f"{role}: {len(graph.node)} nodes for {layers} layers"
