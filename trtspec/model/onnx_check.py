"""Check the exported CPU-engine graphs: the ONNX checker with strict shape inference, and one random step of
every graph in ONNX Runtime against the torch reference network (build time only; torch is imported lazily)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx

from trtspec.checkpoint.model_shape import ModelShape
from trtspec.errors import BuildError
from trtspec.model.onnx_graph import ExportedGraph, WeightPlan
from trtspec.model.onnx_ops import MS_DOMAIN
from trtspec.model.quantize import QuantSpec, fake_quantize
from trtspec.model.ort_session import ort_session
from trtspec import native


def check_graph(path: Path) -> None:
    """Run the ONNX checker and strict shape inference on a saved graph (external data beside it)."""
    path = Path(path)
    try:
        onnx.checker.check_model(str(path))
        with tempfile.TemporaryDirectory() as tmp:
            onnx.shape_inference.infer_shapes_path(str(path), str(Path(tmp) / path.name), strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BuildError(f"{path}: not a valid ONNX graph ({first}); this is a trtspec export bug") from None


def with_accuracy_level(graphs: dict[str, ExportedGraph], level: int, suffix: str) -> dict[str, ExportedGraph]:
    """Copies of the graphs (beside them, over the same weights, named `<role><suffix>.onnx`) whose MatMulNBits nodes
    run at accuracy level `level`; level 1 computes in fp32 with the dequantized weights, exactly the reference's
    arithmetic, so a comparison checks everything the build wrote (packing, scales, layout) at the fp32 tolerance.
    BlockMatMul nodes (MatMulNBits' level-4 numbers) become MatMulNBits nodes at that level over the same blocks, a
    gated one followed by ONNX's Split, Sigmoid and Mul (silu(gate) · up)."""
    import dataclasses

    from onnx import helper, numpy_helper

    twins = {}
    for role, graph in graphs.items():
        model = onnx.load(str(graph.path), load_external_data=False)
        dims = {init.name: tuple(init.dims) for init in model.graph.initializer}
        nodes = []
        for node in model.graph.node:
            nodes.append(node)
            if node.op_type == native.BLOCK_MATMUL and node.domain == native.DOMAIN:
                n, blocks, blob = dims[node.input[1]]
                size = native.BLOCK_MATMUL_BLOCK_SIZE
                gated = any(attr.name == "gated" and attr.i == 1 for attr in node.attribute)
                node.op_type, node.domain = "MatMulNBits", MS_DOMAIN
                del node.attribute[:]
                node.attribute.extend([helper.make_attribute(key, value) for key, value in (
                    ("K", blocks * size), ("N", n), ("bits", blob * 8 // size), ("block_size", size),
                    ("accuracy_level", level))])
                if gated:
                    out = node.output[0]
                    node.output[0] = f"{out}_product"
                    model.graph.initializer.append(numpy_helper.from_array(np.array([n // 2] * 2, np.int64),
                                                                           f"{out}_halves"))
                    nodes += [helper.make_node("Split", [f"{out}_product", f"{out}_halves"],
                                               [f"{out}_gate", f"{out}_up"], axis=-1),
                              helper.make_node("Sigmoid", [f"{out}_gate"], [f"{out}_sigmoid"]),
                              helper.make_node("Mul", [f"{out}_gate", f"{out}_sigmoid"], [f"{out}_silu"]),
                              helper.make_node("Mul", [f"{out}_silu", f"{out}_up"], [out])]
                continue
            if node.op_type == "MatMulNBits":
                for attr in node.attribute:
                    if attr.name == "accuracy_level":
                        attr.i = level
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        path = graph.path.with_name(f"{graph.path.stem}{suffix}.onnx")
        onnx.save_model(model, str(path))
        twins[role] = dataclasses.replace(graph, path=path)
    return twins


def compare_with_reference(ckpt_dir, out_dir, graphs: dict[str, ExportedGraph], *, seed: int = 0,
                           generation_tokens: int = 6, weights: WeightPlan = WeightPlan()) -> dict[str, float]:
    """Run each graph in ONNX Runtime and the torch reference on one random step; return per output the max abs
    difference divided by max(1, max |reference output|).

    Keys are "<graph>.<output>" (new_key / new_value: the new cache rows, the maximum over layers). Context graphs
    get causal prompts (no past); generation graphs a random past, a random tree mask with depth positions, and a
    batch row with a shorter past, over `generation_tokens` slots. `out_dir` holds the graphs
    (their paths in `graphs` are used). A quantized build (`weights`) is compared with the reference computing with
    the same dequantized weights."""
    from trtspec.model.eagle_draft import EagleDraftModel  # torch, at build time only
    from trtspec.model.reference import ReferenceModel

    from trtspec.checkpoint.draft_vocab import read_checkpoint_vocab

    rng = np.random.default_rng(seed)
    # per network (the target "", the EAGLE draft "draft_"): whether its graphs' embedding reads the quantized lm_head
    gathers = {prefix: any(g.embeds_quantized_lm_head for role, g in graphs.items()
                           if role.startswith("draft_") == bool(prefix)) for prefix in ("", "draft_")}
    models = {"": ReferenceModel.from_checkpoint(Path(ckpt_dir))}
    dequantize_reference(models[""], weights.base, weights.drafter, weights.lm_head,
                         embedding_from_lm_head=gathers[""])
    draft_vocab = None
    if any(role.startswith("draft_") for role in graphs):
        models["draft_"] = EagleDraftModel.from_checkpoint(Path(ckpt_dir))
        dequantize_reference(models["draft_"], weights.drafter, None, weights.drafter,
                             embedding_from_lm_head=gathers["draft_"])
        draft_vocab = read_checkpoint_vocab(Path(ckpt_dir), models["draft_"].config.vocab_size)
    diffs = {}
    for role, graph in graphs.items():
        model = models["draft_" if role.startswith("draft_") else ""]
        session = ort_session(graph.path, native_ops=not graph.ops.isdisjoint(native.OPS))
        if role == "medusa":
            diffs["medusa.medusa_logits"] = _compare_medusa(session, model, rng)
            continue
        if role == "redrafter":
            diffs.update(_compare_redrafter(session, model, Path(ckpt_dir), weights, rng))
            continue
        context = role.endswith("context")
        feeds = random_step(model.config, rng, tokens=6 if context else generation_tokens,
                            past=0 if context else 5, features=role.startswith("draft_"))
        if "logit_rows" in {i.name for i in session.get_inputs()}:  # the EAGLE draft's context graph: the last row
            feeds["logit_rows"] = np.full(len(feeds["input_ids"]), feeds["input_ids"].shape[1] - 1, np.int64)
        ours = new_rows(dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds))), feeds)
        reference = last_rows_like(ours, reference_outputs(model, feeds))
        if role.startswith("draft_") and draft_vocab is not None:
            ours["logits"] = _draft_vocab_columns(ours["logits"], draft_vocab.target_ids, graph.path)
            reference["logits"] = reference["logits"][..., draft_vocab.target_ids]
        for name, diff in max_diffs(ours, reference).items():
            diffs[f"{role}.{name}"] = diff / _scale(reference, name)
    return diffs


def dequantize_reference(model, spec: QuantSpec | None, heads: QuantSpec | None,
                         lm_head: QuantSpec | None, *, embedding_from_lm_head: bool) -> None:
    """Give a ReferenceModel / EagleDraftModel the weights a quantized engine computes with: every nn.Linear
    fake-quantized (the Medusa heads' with `heads`, the lm_head with `lm_head`, the others' with `spec`; None: fp32),
    in place. `embedding_from_lm_head`: the exported graph gathers its embedding rows from the quantized lm_head
    (ExportedGraph.embeds_quantized_lm_head), so the embedding becomes the dequantized lm_head; otherwise it stays the
    checkpoint's fp32 table, as the graph's does, whether or not the checkpoint ties the two."""
    import torch
    from torch import nn

    if embedding_from_lm_head and lm_head is None:
        raise ValueError("an embedding gathered from the quantized lm_head needs the lm_head's QuantSpec")
    with torch.no_grad():
        for name, module in model.named_modules():
            use = heads if name.startswith("medusa_heads.") else lm_head if name == "lm_head" else spec
            if use is not None and use.prequantized:  # the checkpoint's codes: the reference read them dequantized
                continue
            if isinstance(module, nn.Linear) and use is not None:
                w = module.weight.detach().float().numpy()
                module.weight.copy_(torch.from_numpy(fake_quantize(w, use.bits, use.block_size, use.scheme)))
        if embedding_from_lm_head:
            model.vocab_embedding.weight.copy_(model.lm_head.weight)


def _draft_vocab_columns(logits: np.ndarray, target_ids: np.ndarray, path: Path) -> np.ndarray:
    """The draft vocabulary's columns of a draft graph's logits, after checking every other column is −inf."""
    outside = np.ones(logits.shape[-1], bool)
    outside[target_ids] = False
    if not np.all(np.isneginf(logits[..., outside])):
        raise BuildError(f"{path}: logits outside the draft vocabulary are not -inf; this is a trtspec export bug")
    return logits[..., target_ids]


def _compare_medusa(session, model, rng: np.random.Generator) -> float:
    import torch

    hidden = rng.standard_normal((3, model.config.hidden_size), dtype=np.float32)
    (ours,) = session.run(None, {"hidden": hidden})
    with torch.no_grad():
        ref = torch.stack([head(torch.from_numpy(hidden)) for head in model.medusa_heads]).float().numpy()
    return float(np.abs(ours - ref).max())


def _compare_redrafter(session, base, ckpt_dir: Path, weights: WeightPlan, rng: np.random.Generator) -> dict:
    """One beam-search step of the drafter graph against the torch drafter (its matrices dequantized as the build's
    `drafter` spec stores them), over the base reference's own embedding rows: rows with and without a state."""
    import torch

    from trtspec.model.reference import ReDrafterReference

    net = ReDrafterReference.from_checkpoint(ckpt_dir)
    dequantize_reference(net, weights.drafter, None, weights.drafter, embedding_from_lm_head=False)
    H = base.config.hidden_size
    hidden, state = (rng.standard_normal((3, H), dtype=np.float32) for _ in range(2))
    tokens = rng.integers(0, base.config.vocab_size, 3).astype(np.int64)
    has_state = np.array([[0.0], [1.0], [1.0]], np.float32)
    if not net.net.rnn:
        state[0] = 0.0  # the first step's state is zeros without a recurrence
    ours = dict(zip(("logits", "next_state"), session.run(None, {"hidden": hidden, "tokens": tokens, "state": state,
                                                                   "has_state": has_state})))
    with torch.no_grad():
        embedded = base.vocab_embedding(torch.from_numpy(tokens))
        logits, next_state = net(torch.from_numpy(hidden), embedded, torch.from_numpy(state),
                                 torch.from_numpy(has_state))
    reference = {"logits": logits.numpy(), "next_state": next_state.float().numpy()}
    return {f"redrafter.{name}": float(np.abs(ours[name] - reference[name]).max()) / _scale(reference, name)
            for name in reference}


def random_step(c: ModelShape, rng: np.random.Generator, *, tokens: int, past: int, batch: int = 2,
                features: bool = False) -> dict[str, np.ndarray]:
    """Graph feeds for one step over a random cache of `past` rows: row 0's past is all of them, the other rows'
    past // 2 fewer (the rows after a row's past are garbage, never read).

    With past = 0 the feeds are a context graph's (causal prompts); otherwise a generation graph's: the new
    tokens form a random tree (each slot's parent is an earlier slot) at positions = past length + depth."""
    lengths = np.full(batch, past, np.int32)
    lengths[1:] -= past // 2
    feeds = {"input_ids": rng.integers(0, c.vocab_size, (batch, tokens))}
    if features:
        feeds["features"] = rng.standard_normal((batch, tokens, c.hidden_size), dtype=np.float32)
    if past:
        tree, depth = np.eye(tokens, dtype=bool), np.zeros(tokens, np.int64)
        for slot in range(1, tokens):
            parent = int(rng.integers(0, slot))
            depth[slot], tree[slot] = depth[parent] + 1, tree[slot] | tree[parent]
        feeds["position_ids"] = lengths[:, None] + depth[None]
        feeds["tree_mask"] = np.broadcast_to(tree, (batch, tokens, tokens)).copy()
    feeds["past_lengths"] = lengths
    kv = (batch, c.num_kv_heads, past, c.head_dim)
    for layer in range(c.num_layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{layer}"] = rng.standard_normal(kv, dtype=np.float32)
    return feeds


def last_rows_like(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's logits cut to the last positions ours has: a base context graph scores its last one only."""
    rows = ours["logits"].shape[1]
    if rows < reference["logits"].shape[1]:
        reference = {**reference, "logits": reference["logits"][:, -rows:]}
    return reference


def new_rows(outputs: dict[str, np.ndarray], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A graph's outputs with each present_{key,value}_{l} [B, nkv, S, hd] replaced by the rows the step wrote,
    new_{key,value}_{l} [B, nkv, T, hd] (row b's start at its past length), the reference's layout."""
    t, out = feeds["input_ids"].shape[1], {}
    for name, value in outputs.items():
        if name.startswith("present_"):
            name = "new_" + name.removeprefix("present_")
            value = np.stack([value[b, :, p:p + t] for b, p in enumerate(feeds["past_lengths"])])
        out[name] = value
    return out


def reference_outputs(model, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a ReferenceModel / EagleDraftModel on graph feeds; return its outputs named and laid out as `new_rows`
    gives the graph's."""
    import torch

    L, (B, T) = model.config.num_layers, feeds["input_ids"].shape
    lengths, past = feeds["past_lengths"], feeds["past_key_0"].shape[2]
    mask = np.zeros((B, T, past + T), bool)  # [B, T, P + T]: a row's own past, then the new tokens
    mask[:, :, past:] = feeds["tree_mask"] if "tree_mask" in feeds else np.tril(np.ones((T, T), bool))
    for b, length in enumerate(lengths):
        mask[b, :, :length] = True
    positions = feeds.get("position_ids", lengths[:, None].astype(np.int64) + np.arange(T))
    t = {k: torch.from_numpy(np.array(v)) for k, v in {**feeds, "attention_mask": mask,
                                                        "position_ids": positions}.items()}  # writable copies
    kv = [torch.stack([t[f"past_{kind}_{layer}"] for layer in range(L)]) for kind in ("key", "value")]
    args = (t["input_ids"], t["features"]) if "features" in t else (t["input_ids"],)
    with torch.no_grad():
        out = model(*args, t["position_ids"], t["attention_mask"], *kv)  # past [L, B, nkv, P, hd]
    result = {"logits": out.logits.numpy(), "hidden": out.hidden.float().numpy()}
    for layer in range(L):  # [B, nkv, T, hd]
        result[f"new_key_{layer}"] = out.new_key[layer].float().numpy()
        result[f"new_value_{layer}"] = out.new_value[layer].float().numpy()
    return result


def _scale(reference: dict[str, np.ndarray], key: str) -> float:
    """max(1, max |reference|) over the outputs folded into `key`: errors are judged relative to the values."""
    values = [v for n, v in reference.items() if (n.rsplit("_", 1)[0] if n.startswith("new_") else n) == key]
    return max(1.0, *(float(np.abs(v).max(initial=0.0)) for v in values))


def max_diffs(ours: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict[str, float]:
    """Max abs difference per output; new_key_{l} / new_value_{l} fold into new_key / new_value."""
    if ours.keys() != reference.keys():
        raise BuildError(f"graph outputs {sorted(ours)} differ from the reference's {sorted(reference)}")
    diffs: dict[str, float] = {}
    for name, value in ours.items():
        if value.shape != reference[name].shape:
            raise BuildError(f"graph output {name} has shape {list(value.shape)}, the reference "
                             f"{list(reference[name].shape)}")
        key = name.rsplit("_", 1)[0] if name.startswith("new_") else name
        diffs[key] = max(diffs.get(key, 0.0), float(np.abs(value - reference[name]).max(initial=0.0)))
    return diffs
