"""Checkpoints: read HF bases, Medusa heads and EAGLE drafts; write and read TensorRT-LLM checkpoints."""
