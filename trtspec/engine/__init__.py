"""Engines: the manifest (single source of truth after build), profiles, and the builders per backend."""

from trtspec.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(__name__, {
    "read_manifest": "trtspec.engine.manifest", "WeightFormat": "trtspec.engine.manifest",
    "BuildOptions": "trtspec.engine.onnx_builder", "build_onnx": "trtspec.engine.onnx_builder:build",
    "plan_build": "trtspec.engine.onnx_builder", "plan_summary": "trtspec.engine.onnx_builder",
    "engine_summary": "trtspec.engine.summary", "is_engine_dir": "trtspec.engine.summary",
    "verify_files": "trtspec.engine.integrity",
    "TrtllmBuildOptions": "trtspec.engine.trtllm_plan", "Lookahead": "trtspec.engine.trtllm_plan",
    "plan_trtllm_build": "trtspec.engine.trtllm_plan",
    "build_trtllm": "trtspec.engine.trtllm_builder:build", "trtllm_available": "trtspec.engine.trtllm_builder",
    "write_plan": "trtspec.engine.trtllm_builder", "read_plan": "trtspec.engine.trtllm_builder",
    "is_planned": "trtspec.engine.trtllm_builder", "expected_engine_files": "trtspec.engine.trtllm_builder",
    "installed_trtllm_version": "trtspec.engine.trtllm_versions:installed_version",
    "newest_trtllm_version": "trtspec.engine.trtllm_versions:newest",
    "parse_trtllm_version": "trtspec.engine.trtllm_versions:parse_version",
})
