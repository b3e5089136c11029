"""`trtspec deploy --flavour llmapi`: the model repository of TensorRT-LLM's LLM API (PyTorch backend).

tensorrtllm_backend's llmapi layout (all_models/llmapi/, v0.19.0; TensorRT-LLM triton_backend/ since):
`tensorrt_llm/config.pbtxt` (Python backend, no max_batch_size: model.py sets it and `decoupled` from
model.yaml's `triton_config`), `tensorrt_llm/1/model.yaml` (the LLM's arguments: the HF base as the GPU host
sees it, `backend: pytorch`, KV cache and batching, `speculative_config`) and `tensorrt_llm/1/model.py`
(trtspec's own model, as for the trtllm flavour's Python models: `trtspec/triton/llmapi_models/`). Every key is
one the chosen version's LLM API accepts (`llmapi_versions`); the drafter is checked against the base first
(`llmapi_check`). Written to a temporary sibling and renamed into place.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from trtspec.checkpoint.hf_config import read_json
from trtspec.errors import ConfigError, RepositoryError
from trtspec.outdir import atomic_output_dir
from trtspec.triton.deploy_options import DECODING_TYPES, LlmapiOptions, check_llmapi_options, \
    check_draft_len_schedule, parse_speculative_options
from trtspec.triton.llmapi_check import base_config, check_drafter, eagle3_capture, mtp_layers
from trtspec.triton.llmapi_versions import KV_CACHE, TOP_LEVEL, LlmapiVersion, parse_llmapi_version
from trtspec.triton.pbtxt import Tensor, TritonModelConfig, render

log = logging.getLogger(__name__)

MODEL = "tensorrt_llm"
MODEL_SOURCE = Path(__file__).parent / "llmapi_models" / "tensorrt_llm.py"
DEFAULT_DRAFT_LEN = 3  # Eagle3 / NGram / DraftTarget K when none is given (TensorRT-LLM's speculative-decoding.md examples)
DEFAULT_NGRAM_MATCH = 3

# tensorrtllm_backend all_models/llmapi/tensorrt_llm/config.pbtxt (v0.19.0): the request and response tensors
_OPTIONAL_INPUTS = (("streaming", "TYPE_BOOL", (1,)), ("sampling_param_beam_width", "TYPE_INT32", (1,)),
                    ("sampling_param_temperature", "TYPE_FP32", (1,)), ("sampling_param_top_k", "TYPE_INT32", (1,)),
                    ("sampling_param_top_p", "TYPE_FP32", (1,)),
                    ("sampling_param_frequency_penalty", "TYPE_FP32", (1,)),
                    ("sampling_param_presence_penalty", "TYPE_FP32", (1,)),
                    ("sampling_param_max_tokens", "TYPE_INT32", (1,)), ("sampling_param_stop", "TYPE_STRING", (-1,)),
                    ("sampling_param_seed", "TYPE_UINT64", (1,)),
                    ("sampling_param_exclude_input_from_output", "TYPE_BOOL", (1,)),
                    ("return_finish_reason", "TYPE_BOOL", (1,)), ("return_stop_reason", "TYPE_BOOL", (1,)),
                    ("return_cumulative_logprob", "TYPE_BOOL", (1,)))
INPUTS = (Tensor("text_input", "TYPE_STRING", (-1,)),) + tuple(Tensor(n, t, d, optional=True)
                                                              for n, t, d in _OPTIONAL_INPUTS)
OUTPUTS = (Tensor("text_output", "TYPE_STRING", (-1,)), Tensor("finish_reason", "TYPE_STRING", (-1,)),
           Tensor("stop_reason", "TYPE_STRING", (-1,)), Tensor("cumulative_logprob", "TYPE_FP32", (-1,)))


@dataclass(frozen=True)
class LlmapiPlan:
    """What the repository holds, validated: the version and the model.yaml document."""

    version: LlmapiVersion
    model_yaml: dict


def deploy_llmapi(options: LlmapiOptions) -> Path:
    """Check the options and the folders, then write the repository atomically; return its path."""
    plan = plan_llmapi(options)
    with atomic_output_dir(Path(options.out), force=options.force) as staging:
        write_llmapi_repository(plan, staging)
    log.info("wrote llmapi repository %s (%s)", options.out, plan.version.name)
    return Path(options.out)


def write_llmapi_repository(plan: LlmapiPlan, staging: Path) -> None:
    version_dir = staging / MODEL / "1"
    version_dir.mkdir(parents=True)
    (staging / MODEL / "config.pbtxt").write_text(render(model_config()))
    (version_dir / "model.yaml").write_text(model_yaml_text(plan))
    shutil.copyfile(MODEL_SOURCE, version_dir / "model.py")


def model_config() -> TritonModelConfig:
    """config.pbtxt as upstream's: the Python backend, one CPU instance (the LLM owns the GPUs), no batch size."""
    return TritonModelConfig(name=MODEL, backend="python", max_batch_size=None, inputs=INPUTS, outputs=OUTPUTS,
                             instance_count=1)


VERSION_LINE = "# trtspec llmapi version: "  # the comment `trtspec doctor` reads the version from


def model_yaml_text(plan: LlmapiPlan) -> str:
    head = (f"# Written by trtspec deploy --flavour llmapi for {plan.version.name}.\n"
            f"{VERSION_LINE}{plan.version.short} (held to {plan.version.held_to}; `trtspec doctor` checks the keys "
            "against it)\n"
            "# model.py passes every key but triton_config to tensorrt_llm.LLM(**args); triton_config sets Triton's\n"
            "# max_batch_size (0: the LLM batches requests in flight) and decoupled (streaming).\n")
    return head + yaml.safe_dump(plan.model_yaml, sort_keys=False, default_flow_style=False)


# ---- the plan ---------------------------------------------------------------------------------------------

def plan_llmapi(options: LlmapiOptions) -> LlmapiPlan:
    check_llmapi_options(options)
    version = parse_llmapi_version(options.trtllm_version)
    hf = Path(options.hf_dir)
    if not (hf / "config.json").is_file():
        raise ConfigError(f"--hf {hf}: no config.json; pass the Hugging Face base folder")
    if options.draft_dir is not None and not (Path(options.draft_dir) / "config.json").is_file():
        raise ConfigError(f"{options.draft_dir}: no config.json; pass the draft's Hugging Face folder")
    problems = check_drafter(hf, options.drafter, options.draft_dir)
    if problems:
        raise RepositoryError("; ".join(problems))
    doc = {"model": options.model_path or str(hf.resolve()), "backend": "pytorch",
           "tensor_parallel_size": 1, "pipeline_parallel_size": 1,
           "max_batch_size": options.max_batch_size, "max_num_tokens": options.max_num_tokens,
           "kv_cache_config": {"free_gpu_memory_fraction": options.kv_cache_free_gpu_mem_fraction,
                               "enable_block_reuse": options.kv_cache_reuse}}
    if options.drafter is not None:
        doc["speculative_config"] = speculative_config(options, version, base_config(hf))
    if options.drafter == "eagle3":
        severity, line = eagle3_capture(base_config(hf), read_json(Path(options.draft_dir) / "config.json"),
                                        doc["speculative_config"].get("eagle3_layers_to_capture"))
        if severity == "warning":
            log.warning("%s: %s", options.draft_dir, line)
    doc["triton_config"] = {"max_batch_size": 0, "decoupled": options.decoupled}
    _check_keys(doc, version)
    return LlmapiPlan(version=version, model_yaml=doc)


def speculative_config(options: LlmapiOptions, version: LlmapiVersion, base: dict) -> dict:
    """The speculative_config block: decoding_type and its fields, every one checked against the version."""
    decoding_type = DECODING_TYPES[options.drafter]
    version.fields(decoding_type)  # a class the version's table lacks: one line before anything else
    k = options.max_draft_len
    spec: dict = {"decoding_type": decoding_type}
    if options.drafter == "mtp":
        # MTP drafts one token per MTP module; more than the base declares run its last module again (MTP-Eagle)
        spec["num_nextn_predict_layers"] = k or mtp_layers(base)
    else:
        spec["max_draft_len"] = k or DEFAULT_DRAFT_LEN
    if options.drafter in ("eagle3", "draft_target"):
        spec["speculative_model"] = options.draft_path or str(Path(options.draft_dir).resolve())
    if options.drafter == "ngram":
        spec.update(max_matching_ngram_size=options.max_matching_ngram_size or DEFAULT_NGRAM_MATCH,
                    is_keep_all=True, is_use_oldest=True, is_public_pool=True)
    if options.dynamic_tree_top_k is not None:
        spec.update(use_dynamic_tree=True, dynamic_tree_max_topK=options.dynamic_tree_top_k)
    if options.max_total_draft_tokens is not None:
        spec["max_total_draft_tokens"] = options.max_total_draft_tokens
    if options.max_concurrency is not None:
        spec["max_concurrency"] = options.max_concurrency
    if options.draft_len_schedule is not None:
        spec["draft_len_schedule"] = dict(options.draft_len_schedule)
    extra = parse_speculative_options(options.speculative_options)
    clash = sorted(set(extra) & set(spec))
    if clash:
        raise ConfigError(f"--speculative-option {clash[0]}: trtspec writes it from its own option; set that instead")
    spec.update(extra)
    if "draft_len_schedule" in spec:  # from the flag or a --speculative-option: TensorRT-LLM's rules either way
        schedule = spec["draft_len_schedule"]
        if not isinstance(schedule, dict) or not all(type(a) is int and type(b) is int for a, b in schedule.items()):
            raise ConfigError(f"draft_len_schedule must map batch sizes to draft lengths, e.g. {{1: 4, 4: 2}}, got "
                              f"{schedule!r}")
        check_draft_len_schedule(schedule, spec.get("max_draft_len", spec.get("num_nextn_predict_layers")))
        spec["draft_len_schedule"] = dict(sorted(schedule.items()))
    version.check(decoding_type, spec)
    return spec


def _check_keys(doc: dict, version: LlmapiVersion) -> None:
    """Nothing outside the version's table reaches model.yaml (a guard on the writer itself)."""
    unknown = [k for k in doc if k not in TOP_LEVEL and k != "triton_config"]
    unknown += [f"kv_cache_config.{k}" for k in doc["kv_cache_config"] if k not in KV_CACHE]
    if unknown:
        raise RepositoryError(f"{version.name}: model.yaml would hold {unknown[0]}, which trtspec does not hold for "
                              "this version")
