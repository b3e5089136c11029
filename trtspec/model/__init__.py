"""The reference network (torch, CPU) over TensorRT-LLM checkpoint weights, and its ONNX export."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {"quiet_numpy_subnormal_warning": "trtspec.model.ort_session"})
