"""The reference network (torch, CPU) over TensorRT-LLM checkpoint weights, and its ONNX export."""
