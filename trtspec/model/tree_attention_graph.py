"""A graph of one TreeAttention node (com.trtspec), its inputs and outputs named as the op's, for tests and
micro-benchmarks of the op alone (trtspec/native). Needs onnx (the build extra)."""

from __future__ import annotations

from dataclasses import dataclass

from trtspec.model.onnx_ops import IR_VERSION, OPSET
from trtspec.native import DOMAIN, TREE_ATTENTION

INPUTS = ("qkv", "past_key", "past_value", "past_lengths", "position_ids", "tree_mask", "cos_cache", "sin_cache")
OUTPUTS = ("attn", "present_key", "present_value")


@dataclass(frozen=True)
class AttentionShape:
    """Heads and head size of one attention layer (SmolLM2-135M: 9 query heads, 3 KV heads, 64)."""

    num_heads: int
    kv_num_heads: int
    head_size: int

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.kv_num_heads) * self.head_size


SMOLLM2 = AttentionShape(9, 3, 64)


def tree_attention_model(shape: AttentionShape, *, cache_head_size: int | str | None = None):
    """onnx.ModelProto: one TreeAttention node over graph inputs of the op's names; batch, slots, capacity and rotary
    positions are symbolic. `cache_head_size` overrides the head size the cache inputs declare (a str: symbolic),
    so that tests can give the op a cache whose head size it must refuse."""
    import onnx
    from onnx import TensorProto, helper

    hd = shape.head_size if cache_head_size is None else cache_head_size
    cache = ["B", shape.kv_num_heads, "capacity", hd]
    half = hd // 2 if isinstance(hd, int) else "half"
    inputs = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["B", "T", shape.qkv_width]),
        helper.make_tensor_value_info("past_key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_value", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_lengths", TensorProto.INT32, ["B"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["B", "T"]),
        helper.make_tensor_value_info("tree_mask", TensorProto.BOOL, ["B", "T", "T"]),
        helper.make_tensor_value_info("cos_cache", TensorProto.FLOAT, ["P", half]),
        helper.make_tensor_value_info("sin_cache", TensorProto.FLOAT, ["P", half]),
    ]
    outputs = [
        helper.make_tensor_value_info("attn", TensorProto.FLOAT, ["B", "T", shape.num_heads * shape.head_size]),
        helper.make_tensor_value_info("present_key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("present_value", TensorProto.FLOAT, cache),
    ]
    node = helper.make_node(TREE_ATTENTION, list(INPUTS), list(OUTPUTS), domain=DOMAIN,
                            num_heads=shape.num_heads, kv_num_heads=shape.kv_num_heads)
    graph = helper.make_graph([node], "tree_attention", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, 1)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model
