"""The exported ONNX graphs against the torch reference on tiny checkpoints of every format: a causal prompt
batch, a tree step over a past, a batch of rows with different pasts, the KV buffer shared by past and present;
the graphs' dynamic token count, the shared weight file, the checker, and the torch-free import of the module.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from trtspec import BuildError, ConvertOptions, convert, read_trtllm_checkpoint
from trtspec.checkpoint.model_shape import ModelShape
from trtspec.model.eagle_draft import EagleDraftModel
from trtspec.model.onnx_check import (check_graph, compare_with_reference, last_rows_like, max_diffs, new_rows,
                                      reference_outputs)
from trtspec.model.onnx_graph import check_supported, export_graphs
from trtspec.model.ort_session import session_options
from trtspec.model.reference import ReferenceModel
from trtspec.testing import add_llama_biases, TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

TOL = 1e-4  # max abs diff, ONNX Runtime vs the torch reference, both float32 (observed <= 1e-6)
K = 3  # the tree steps here feed K + 1 = 4 slots
CAPACITY = 24  # rows of the KV buffers fed to the graphs (the runtime's max_seq_len + K + 1)
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
        self.graphs = export_graphs(read_trtllm_checkpoint(self.ckpt_dir), self.out, max_positions=CAPACITY)
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


def feeds_for(config, rng, ids, lengths, *, positions=None, tree=None, features=False) -> dict[str, np.ndarray]:
    """Graph feeds over random KV buffers [B, nkv, CAPACITY, hd] (rows past a row's length are garbage);
    positions and a tree mask [T, T] for generation graphs."""
    B, T = ids.shape
    feeds = {"input_ids": ids}
    if features:
        feeds["features"] = rng.standard_normal((B, T, config.hidden_size), dtype=np.float32)
    if tree is not None:
        feeds["position_ids"] = np.asarray(positions, np.int64)
        feeds["tree_mask"] = np.broadcast_to(tree, (B, T, T)).copy()
    feeds["past_lengths"] = np.asarray(lengths, np.int32)
    if features and tree is None:  # the EAGLE draft's context graph scores each row's last entry
        feeds["logit_rows"] = np.full(B, T - 1, np.int64)
    for layer in range(config.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng.standard_normal((B, config.num_kv_heads, CAPACITY, config.head_dim),
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
    """Our outputs (present_* as the new rows, new_*) equal the reference's; also every past row is kept."""
    raw = ex.run(role, feeds)
    for name, value in raw.items():
        if name.startswith("present_"):
            past = feeds[name.replace("present_", "past_")]
            for b, length in enumerate(feeds["past_lengths"]):
                assert np.array_equal(value[b, :, :length], past[b, :, :length]), f"{what}: {name} row {b} past"
    ours = new_rows(raw, feeds)
    model = ex.models[role.removesuffix("context").removesuffix("generation")]
    for name, diff in max_diffs(ours, last_rows_like(ours, reference_outputs(model, feeds))).items():
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
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, T)), [0, 0], features=role.startswith("draft_"))
        out = assert_matches_reference(ex, role, feeds, f"{case} prompt batch")
        # a context graph scores the last position only (the draft's: each row's `logit_rows`)
        assert out["logits"].shape == (2, 1, c.vocab_size) and out["hidden"].shape[1] == T
        assert out["new_key_0"].shape == (2, c.num_kv_heads, T,
                                                                                           c.head_dim)
        if CASES[case][1] and CASES[case][1][0] == "medusa":
            assert_medusa_heads_match_reference(ex, out["hidden"][0], CASES[case][1][1]["num_heads"], case)


@pytest.mark.parametrize("case", ["llama_gqa", "qwen2_biases", "eagle_2_layers"])
def test_context_graph_after_pasts_of_different_lengths(exported, case):
    """Several causal tokens after each row's own past (EAGLE's draft_extend; a batch of prompt chunks)."""
    ex = exported(case)
    rng = np.random.default_rng(5)
    for role in roles(ex, "context"):
        c = ex.models[role.removesuffix("context")].config
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, 3)), [6, 2], features=role.startswith("draft_"))
        assert_matches_reference(ex, role, feeds, f"{case} context after a past")


def test_draft_context_scores_the_row_each_batch_row_names(exported):
    """A batch of draft extensions padded at the end: row b's logits are those of its entry logit_rows[b]."""
    ex = exported("eagle_1_layer")
    rng = np.random.default_rng(11)
    c = ex.models["draft_"].config
    feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, 5)), [3, 1], features=True)
    feeds["logit_rows"] = np.array([4, 1], np.int64)
    out = new_rows(ex.run("draft_context", feeds), feeds)
    reference = reference_outputs(ex.models["draft_"], feeds)["logits"]  # [2, 5, V]
    for b, row in enumerate(feeds["logit_rows"]):
        assert np.abs(out["logits"][b, 0] - reference[b, row]).max() <= TOL * max(1.0, np.abs(reference[b, row]).max())


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
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, K + 1)), [P, P],
                          positions=np.broadcast_to(P + depth, (2, K + 1)), tree=tree,
                          features=role.startswith("draft_"))
        assert_matches_reference(ex, role, feeds, f"{case} tree step")


@pytest.mark.parametrize("case", ["llama_gqa", "qwen2_biases", "eagle_2_layers"])
def test_batch_row_with_a_shorter_past_equals_row_alone(exported, case):
    ex = exported(case)
    rng = np.random.default_rng(2)
    tree, depth = tree_mask()
    lengths = (7, 4)
    for role in roles(ex, "generation"):
        c = ex.models[role.removesuffix("generation")].config
        feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, K + 1)), lengths,
                          positions=np.asarray(lengths)[:, None] + depth, tree=tree, features=role.startswith("draft_"))
        batched = assert_matches_reference(ex, role, feeds, f"{case} batch of different pasts")
        alone = {k: np.ascontiguousarray(v[1:2]) for k, v in feeds.items()}
        single = new_rows(ex.run(role, alone), alone)
        for name, value in single.items():
            diff = float(np.abs(batched[name][1:2] - value).max())
            assert diff <= 1e-5, f"{case} {role} {name}: batch row vs row alone differ by {diff:.3g} > 1e-5"


def test_present_shares_the_past_buffer(exported):
    """Bound to one buffer as past and present, each layer's cache gets the new rows after each row's past and
    keeps every other row: what the runtime relies on to append in place."""
    ex = exported("llama_gqa")
    rng = np.random.default_rng(3)
    c, tree, depth = ex.models[""].config, *tree_mask()
    lengths = (5, 9)
    feeds = feeds_for(c, rng, rng.integers(0, c.vocab_size, (2, K + 1)), lengths,
                      positions=np.asarray(lengths)[:, None] + depth, tree=tree)
    expected = new_rows(ex.run("generation", feeds), feeds)
    session, kv = ex.session("generation"), {k: v.copy() for k, v in feeds.items()
                                                      if k.startswith(("past_key_", "past_value_"))}
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, kv.get(name, value))
    for out in session.get_outputs():
        if out.name.startswith("present_"):
            buffer = kv[out.name.replace("present_", "past_")]
            binding.bind_output(out.name, "cpu", 0, np.float32, list(buffer.shape), buffer.ctypes.data)
        else:
            binding.bind_output(out.name, "cpu")
    session.run_with_iobinding(binding)
    for name, buffer in kv.items():
        new = expected[name.replace("past_", "new_")]
        for b, p in enumerate(lengths):
            assert np.array_equal(buffer[b, :, p:p + K + 1], new[b]), (name, b)
            kept = np.concatenate([buffer[b, :, :p], buffer[b, :, p + K + 1:]], axis=1)
            assert np.array_equal(kept, np.concatenate([feeds[name][b, :, :p], feeds[name][b, :, p + K + 1:]],
                                                       axis=1)), (name, b)


# ---- the token count, the weight file, the checker, the import -----------------------------------------------

def test_graphs_take_any_number_of_tokens(exported):
    ex = exported("eagle_1_layer")
    for role in ("generation", "draft_generation"):
        model = onnx.load(str(ex.graphs[role].path), load_external_data=False)
        dims = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
                for v in [*model.graph.input, *model.graph.output]}
        assert dims["input_ids"] == ["batch", "tokens"] and dims["tree_mask"] == ["batch", "tokens", "tokens"]
        assert dims["past_key_0"] == dims["present_value_0"] == ["batch", 2, "capacity", 16]
    context = onnx.load(str(ex.graphs["context"].path), load_external_data=False)
    assert context.graph.input[0].type.tensor_type.shape.dim[1].dim_param == "tokens"
    assert not {"position_ids", "tree_mask"} & {i.name for i in context.graph.input}
    c = ex.models[""].config
    for T in (1, K + 2):
        tree, depth = np.tril(np.ones((T, T), bool)), np.arange(T)
        feeds = feeds_for(c, np.random.default_rng(4), np.zeros((1, T), np.int64), [0], positions=depth[None],
                          tree=tree)
        assert ex.run("generation", feeds)["logits"].shape == (1, T, c.vocab_size)
        context_feeds = {k: v for k, v in feeds.items() if k not in ("position_ids", "tree_mask")}
        assert ex.run("context", context_feeds)["logits"].shape == (1, 1, c.vocab_size)


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
    assert ex.graphs["draft_generation"].inputs[:5] == ("input_ids", "features", "position_ids", "tree_mask",
                                                        "past_lengths")
    assert ex.graphs["draft_generation"].outputs[:2] == ("logits", "hidden")


def test_compare_with_reference_names_every_output(exported):
    ex = exported("eagle_1_layer")
    diffs = compare_with_reference(ex.ckpt_dir, ex.out, ex.graphs)
    assert set(diffs) == {f"{role}.{name}" for role in ex.graphs
                          for name in ("logits", "hidden", "new_key", "new_value")}
    assert max(diffs.values()) <= TOL, f"compare_with_reference: {diffs} exceeds {TOL:g}"


@pytest.mark.parametrize("positions, error", [
    (16, None), (0, "max_positions must be a positive int"), (True, "max_positions must be a positive int")])
def test_max_positions(tmp_path, exported, positions, error):
    ckpt = read_trtllm_checkpoint(exported("llama_gqa").ckpt_dir)
    if error:
        with pytest.raises(BuildError, match=error):
            export_graphs(ckpt, tmp_path, max_positions=positions)
        return
    graphs = export_graphs(ckpt, tmp_path, max_positions=positions)
    check_graph(graphs["generation"].path)


def test_head_dim_the_attention_kernel_cannot_run_is_a_build_error(exported):
    c = ModelShape.from_trtllm(read_trtllm_checkpoint(exported("llama_gqa").ckpt_dir).config)
    check_supported(c)
    with pytest.raises(BuildError, match="the model's head_dim is 8; .* needs a multiple of 16"):
        check_supported(dataclasses.replace(c, head_dim=8))


def test_check_graph_names_the_broken_file(tmp_path, exported):
    model = onnx.load(str(exported("llama_gqa").graphs["context"].path), load_external_data=False)
    model.graph.node[5].input[0] = "no_such_tensor"
    onnx.save_model(model, str(tmp_path / "context.onnx"))
    (tmp_path / "weights.bin").write_bytes((exported("llama_gqa").out / "weights.bin").read_bytes())
    with pytest.raises(BuildError, match=r"context\.onnx: not a valid ONNX graph"):
        check_graph(tmp_path / "context.onnx")


@pytest.mark.parametrize("threads, expected", [(1, 1), (3, 3), (None, os.cpu_count())])
def test_session_options(threads, expected):
    options = session_options(threads, spin=False)
    assert options.intra_op_num_threads == expected and options.inter_op_num_threads == 1
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.get_session_config_entry("session.force_spinning_stop") == "1"
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.get_session_config_entry("session.set_denormal_as_zero") == "1"


@pytest.mark.parametrize("env, spin, spinning", [("1", None, "1"), ("0", None, "0"), ("0", True, "1"),
                                                 ("1", False, "0"), (None, None, "1")])
def test_spinning_is_the_default_and_an_explicit_choice_overrides_the_environment(monkeypatch, env, spin, spinning):
    if env is None:
        monkeypatch.delenv("TRTSPEC_ORT_SPIN", raising=False)
    else:
        monkeypatch.setenv("TRTSPEC_ORT_SPIN", env)
    options = session_options(2, spin)
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == spinning
    assert options.get_session_config_entry("session.force_spinning_stop") == {"1": "0", "0": "1"}[spinning]


def test_module_imports_without_torch():
    code = "import sys, trtspec.model.onnx_graph; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False", "importing trtspec.model.onnx_graph must not import torch"


def test_the_serving_path_needs_neither_onnx_nor_torch():
    code = ("import sys, trtspec.runtime.generator, trtspec.model.ort_session as s; s.session_options(1); "
            "print(sorted({'onnx', 'torch'} & set(sys.modules)))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize("case", ["llama_gqa", "tied_embeddings", "eagle_2_layers"])
def test_graphs_attend_in_one_fused_node_per_layer(exported, case):
    """Per layer the graph stays small: the cache reaches attention only through one GroupQueryAttention node,
    which also writes the new rows (no Transpose / Reshape / Softmax around it), each residual Add is fused into
    the next norm, and a vocabulary matrix is stored [V, H] (the embedding rows are gathered along axis 0, the
    lm_head transposes the weight itself, which ONNX Runtime folds once at load)."""
    ex = exported(case)
    for role in [r for r in ex.graphs if "context" in r or "generation" in r]:
        graph = onnx.load(str(ex.graphs[role].path), load_external_data=False).graph
        layers = sum(1 for i in graph.input if i.name.startswith("past_key_"))
        consumers = {}
        for node in graph.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
        for layer in range(layers):
            (attention,) = consumers[f"past_key_{layer}"]
            assert attention.op_type == "GroupQueryAttention" and consumers[f"past_value_{layer}"] == [attention]
            assert list(attention.output) == [f"layers.{layer}.attn", f"present_key_{layer}",
                                              f"present_value_{layer}"], role
        ops = [n.op_type for n in graph.node]
        assert not {"Reshape", "Softmax"} & set(ops), role
        weights = {t.name for t in graph.initializer}
        assert all(n.input[0] in weights for n in graph.node if n.op_type == "Transpose"), role
        # the prelude's two (past lengths + T), EAGLE's fc bias and its last residual: the others fuse into norms
        assert ops.count("Add") <= 4, f"{role}: residual Adds not fused into the norms"
        assert all(n.attribute[0].i == 0 for n in graph.node if n.op_type == "Gather"), role
        assert len(graph.node) <= 11 * layers + 40, f"{role}: {len(graph.node)} nodes for {layers} layers"
