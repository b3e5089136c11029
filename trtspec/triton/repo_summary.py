"""`trtspec inspect REPO`: what a Triton model repository serves, read from its configs (either flavour)."""

from __future__ import annotations

from pathlib import Path

from trtspec.errors import ConfigError

ENGINE_MODELS = ("tensorrt_llm", "trtspec_engine")


def is_model_repository(directory: Path) -> bool:
    return any(Path(directory).glob("*/config.pbtxt"))


def repository_summary(repo: Path) -> dict:
    """Flavour, the engine it loads and how (method, datastore, threads / the TensorRT-LLM engine path and decoding
    mode), and one line per model: backend, max_batch_size, decoupled, instances."""
    from trtspec.model.ort_session import threads_text
    from trtspec.triton.doctor import load_model_configs, model_params
    from trtspec.triton.model_args import repository_path

    repo = Path(repo)
    models, findings = load_model_configs(repo)
    if not models:
        problem = findings[0].message if findings else "no */config.pbtxt Triton can parse"
        raise ConfigError(f"{repo}: not a model repository Triton can load ({problem})")
    engine_name = next((n for n in ENGINE_MODELS if n in models and model_params(models[n]).get("engine_dir")),
                       "tensorrt_llm")
    engine = models.get(engine_name, {})
    params = model_params(engine)
    out: dict = {"flavour": "cpu" if engine.get("backend") == "python" else "trtllm",
                 "models": {name: _model_line(model) for name, model in models.items()}}
    if "engine_dir" in params:
        out["engine"] = str(repository_path(repo, params["engine_dir"]))
        out["method"] = params.get("method", "auto")
        if params.get("datastore"):
            out["datastore"] = params["datastore"]
        out["threads"] = threads_text(params.get("threads", "0"))  # 0: all cores
        out["spin"] = params.get("spin", "auto")
    elif "gpt_model_path" in params:
        out["engine"] = params["gpt_model_path"]
        for key in ("decoding_mode", "batching_strategy", "medusa_choices", "eagle_choices",
                    "lookahead_window_size", "kv_cache_free_gpu_mem_fraction"):
            if params.get(key):
                out[key] = params[key]
    if findings:
        out["problems"] = [f"{f.model}: {f.field}: {f.message}" for f in findings]
    return out


def _model_line(model: dict) -> str:
    policy = model.get("model_transaction_policy", {})
    instances = sum(int(g.get("count", 1)) for g in model.get("instance_group", [])) or 1
    backend = model.get("backend") or model.get("platform", "")
    return (f"{backend}, max_batch_size {model.get('max_batch_size', 0)}, "
            f"{'decoupled' if policy.get('decoupled') else 'unary'}, {instances} instance(s)")
