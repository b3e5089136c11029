"""`trtspec doctor REPO [ENGINE_DIR]`: cross-check a Triton TensorRT-LLM repository (trtspec's or hand-made) against
its engine, and list every mismatch upstream only reports at request time or not at all. trtspec's CPU flavour gets
its own checks (the engine its engine model loads, its files' sizes and hashes, the compiled ops it runs, the method
and datastore it asks for, threads against cores), each listed as checked when it holds.

Each check cites the public issue it catches (tensorrtllm_backend#n, TensorRT-LLM#n, Medusa#n) or the upstream file
whose rule it enforces; `docs/upstream-sources.md` lists them.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from trtspec.engine.manifest import Backend
from trtspec.engine.resolve import DEFAULT_TREE
from trtspec.engine.trtllm_builder import expected_engine_files, is_planned, read_plan
from trtspec.engine.trtllm_plan import SpecMode, Lookahead, cpp_choices
from trtspec.engine.trtllm_versions import installed_version, parse_version
from trtspec.errors import ConfigError, TrtspecError
from trtspec.speculative.tree import build_tree, parse_choices
from trtspec.speculative.tree_presets import preset

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")
MODE_BITS = {m.bit: m for m in SpecMode}
DECODING_MODES = {SpecMode.MEDUSA: "medusa", SpecMode.EAGLE: "eagle", SpecMode.LOOKAHEAD: "lookahead",
                  SpecMode.EXPLICIT_DRAFT_TOKENS: "redrafter"}  # model_instance_state.cc: redrafter = ExplicitDraftTokens
BATCHING_STRATEGIES = ("inflight_fused_batching", "inflight_batching", "V1", "v1")
TYPE_OF_DTYPE = {"float32": "TYPE_FP32", "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}
TRUE = ("true", "True", "TRUE", "1")


@dataclass(frozen=True)
class Finding:
    # "error": fails at load or request time, or silently wrong; "warning": likely not intended; "note": a fact a
    # person needs (the engine's quantization, which request tensor names the repository takes), not a problem
    severity: str
    model: str
    field: str
    message: str  # what, and the fix

    def __str__(self) -> str:
        return f"{self.severity}: {self.model}: {self.field}: {self.message}"


@dataclass
class TrtllmEngineConfig:
    """A built TensorRT-LLM engine as doctor reads it: the folder and its config.json."""

    path: Path
    config: dict  # the engine's config.json: version, pretrained_config, build_config

    @property
    def build(self) -> dict:
        return self.config.get("build_config", {})

    @property
    def pretrained(self) -> dict:
        return self.config.get("pretrained_config", {})

    @property
    def mode(self) -> SpecMode:
        return MODE_BITS.get(self.build.get("speculative_decoding_mode", 1), SpecMode.NONE)

    @property
    def max_draft_len(self) -> int:
        """What the C++ runtime uses: pretrained_config for Medusa, build_config otherwise (TensorRT-LLM tensorrt_llm/builder.py Engine.save)."""
        source = self.pretrained if self.mode is SpecMode.MEDUSA else self.build
        return int(source.get("max_draft_len") or 0)


@dataclass(frozen=True)
class Checked:
    """One thing doctor looked at, and what it found there: `trtspec doctor` lists them beside the findings, so that
    "no problems found" says over what."""

    model: str
    what: str  # engine, hashes, compiled ops, method, datastore, threads, ...
    result: str

    def __str__(self) -> str:
        return f"checked: {self.model}: {self.what}: {self.result}"


def doctor(repo: Path, engine_dir: Path | None = None, checked: list[Checked] | None = None) -> list[Finding]:
    """Every problem found in `repo` (against `engine_dir`, else each LLM model's gpt_model_path); what was checked is
    appended to `checked` when given."""
    repo = Path(repo)
    if not repo.is_dir():
        raise ConfigError(f"{repo} is not a directory")
    findings: list[Finding] = []
    models = _load_models(repo, findings)
    if not models:
        raise ConfigError(f"{repo} holds no model (no */config.pbtxt); not a Triton model repository")
    llms = {name: m for name, m in models.items()
            if m.get("backend") == "tensorrtllm" or "gpt_model_path" in _params(m)}
    for name, model in llms.items():
        engine = _engine(name, model, engine_dir if name == "tensorrt_llm" or len(llms) == 1 else None, findings)
        findings += check_llm(name, model, engine)
    findings += check_preprocessing(models)
    findings += check_cpu_engine(models, repo, engine_dir, checked)
    findings += check_ensemble(models)
    findings += check_bls(models, llms, repo, engine_dir, findings)
    from trtspec.triton.llmapi_doctor import check_llmapi  # the llmapi flavour: MODEL/1/model.yaml

    findings += check_llmapi(repo, checked)
    return findings


# ---- loading ------------------------------------------------------------------------------------------

def load_model_configs(repo: Path) -> tuple[dict[str, dict], list[Finding]]:
    """Every model's config.pbtxt as a dict (Triton's own protobuf), and what kept a config from parsing."""
    findings: list[Finding] = []
    return _load_models(Path(repo), findings), findings


def _load_models(repo: Path, findings: list[Finding]) -> dict[str, dict]:
    try:
        from google.protobuf import json_format, text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:
        raise ConfigError("trtspec doctor parses configs with Triton's protobuf: pip install 'trtspec[client]'") \
            from None
    models = {}
    for path in sorted(repo.glob("*/config.pbtxt")):
        name, text = path.parent.name, path.read_text(errors="replace")
        for key in sorted(set(PLACEHOLDER.findall(text))):  # tensorrtllm_backend#526: `${triton_backend}` etc.
            findings.append(Finding("error", name, key, f"unfilled placeholder ${{{key}}}; fill it (e.g. with "
                                                         "`trtspec deploy`, or fill_template.py)"))
        parseable = re.sub(r'(?<!")\$\{[^}]*\}(?!")', "0", text)  # unquoted placeholders parse as 0
        try:
            message = text_format.Parse(parseable, model_config_pb2.ModelConfig())
        except text_format.ParseError as e:
            findings.append(Finding("error", name, "config.pbtxt", f"Triton cannot parse it: {e}"))
            continue
        models[name] = json_format.MessageToDict(message, preserving_proto_field_name=True)
        models[name]["_dir"] = str(path.parent)
    return models


def _params(model: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in model.get("parameters", {}).items()}


model_params = _params  # a model config's parameters as {key: string_value} (repo_summary reads them too)


def _set(value: str | None) -> bool:
    return bool(value) and not PLACEHOLDER.fullmatch(value.strip())


def _engine(name: str, model: dict, engine_dir: Path | None, findings: list[Finding]) -> TrtllmEngineConfig | None:
    path_param = _params(model).get("gpt_model_path", "")
    path = Path(engine_dir) if engine_dir is not None else Path(path_param) if _set(path_param) else None
    if path is None:
        return None
    if engine_dir is not None and _set(path_param) and Path(path_param).resolve() != path.resolve():
        findings.append(Finding("warning", name, "gpt_model_path", f"points to {path_param}, not the engine "
                                                                    f"checked here ({path})"))
    config_path = path / "config.json"
    planned = is_planned(path)  # `trtspec build --plan-only`: the manifest is there, trtllm-build has not run yet
    if not config_path.is_file() and planned:
        plan = read_plan(path)
        missing = _missing_engine_files(path, plan.get("engine_config") or {})
        command = f"`{plan['command_line']}`" if plan.get("command_line") else "the plan's trtllm-build command"
        findings.append(Finding("warning", name, "engine files", f"{path} is a planned engine: {', '.join(missing)} "
                                f"still to come. Run {command} on the GPU host (or there the `trtspec build` that "
                                "planned it, without --plan-only); until then the checks here use the plan's engine "
                                "config"))
        return TrtllmEngineConfig(path, plan["engine_config"]) if isinstance(plan.get("engine_config"), dict) else None
    if not config_path.is_file():
        findings.append(Finding("error", name, "gpt_model_path", f"{path} holds no engine config.json; the model "
                                                                  "fails to load (build the engine or fix the path)"))
        return None
    try:
        config = json.loads(config_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        findings.append(Finding("error", name, "gpt_model_path", f"{config_path} is unreadable ({e})"))
        return None
    missing = _missing_engine_files(path, config)
    if missing:  # trtllm-build writes one rank{r}.engine per rank of the mapping beside config.json
        findings.append(Finding("warning" if planned else "error", name, "engine files",
                                f"{path} has config.json but lacks {', '.join(missing)}; the model fails to load "
                                "(an interrupted or partly copied build: build it again)"))
    return TrtllmEngineConfig(path, config)


def _missing_engine_files(path: Path, config: dict) -> list[str]:
    mapping = (config.get("pretrained_config") or {}).get("mapping") or {}
    world = mapping.get("world_size") or (mapping.get("tp_size") or 1) * (mapping.get("pp_size") or 1)
    return [f for f in expected_engine_files(world if isinstance(world, int) and world >= 1 else 1)
            if not (path / f).is_file()]


# ---- the engine model ---------------------------------------------------------------------------------

def check_llm(name: str, model: dict, engine: TrtllmEngineConfig | None) -> list[Finding]:
    params, out = _params(model), []
    add = lambda sev, field, msg: out.append(Finding(sev, name, field, msg))  # noqa: E731
    strategy = params.get("gpt_model_type")
    if strategy not in BATCHING_STRATEGIES:  # tensorrtllm_backend tensorrt_llm/config.pbtxt: any other value throws at load
        add("error", "gpt_model_type", f"{strategy!r} is not one of inflight_fused_batching, inflight_batching, V1")
    if params.get("tokenizer_type") is not None:
        add("warning", "tokenizer_type", "removed in v0.9 (tensorrtllm_backend#526); delete it")
    if engine is None:
        return out
    mode, decoding = engine.mode, params.get("decoding_mode", "")
    out += _check_decoding_mode(name, mode, decoding)
    out += _check_redrafter(name, engine)
    out += _check_tree(name, params, engine)
    out += _check_lookahead(name, params, engine)
    out += _check_engine_limits(name, model, params, engine)
    out += check_trtllm_quantization(name, engine)
    return out


def check_trtllm_quantization(name: str, engine: TrtllmEngineConfig) -> list[Finding]:
    """The engine's quantization (pretrained_config.quantization) as a note, checked against the trtspec
    manifest beside it (engine.trtllm_quant), with a warning for quantized Medusa heads (TensorRT-LLM#2115, #1845)."""
    q = engine.pretrained.get("quantization") or {}
    algo = q.get("quant_algo")
    planned = _manifest_field(engine.path, "quantization")
    out = []
    if planned is not None and planned.get("quant_algo") != algo:
        out.append(Finding("error", name, "quantization", f"the engine was built with quant_algo={algo}, its "
                                                          f"manifest planned {planned.get('quant_algo')}: rebuild it"))
    if algo is None and q.get("kv_cache_quant_algo") is None:
        return out
    drafter = (planned or {}).get("drafter")
    facts = [f"quant_algo={algo}"] + [f"{key}={q[key]}" for key in ("group_size", "kv_cache_quant_algo")
                                       if q.get(key) is not None]
    if drafter is not None:
        facts.append(f"drafter {drafter}")
    out.append(Finding("note", name, "quantization", ", ".join(facts)))
    if engine.mode is SpecMode.MEDUSA and drafter == "quantized":
        out.append(Finding("warning", name, "quantization", "the Medusa heads are quantized (--quant_medusa_head): "
                                                            "upstream builds have failed on that (TensorRT-LLM#2115 "
                                                            "FP8 heads, #1845 weight-only); keep them in the base dtype"))
    return out


def _manifest_field(engine_dir: Path, key: str):
    path = Path(engine_dir) / "manifest.json"
    try:
        return json.loads(path.read_text()).get(key) if path.is_file() else None
    except (OSError, json.JSONDecodeError):
        return None


def _check_decoding_mode(name: str, mode: SpecMode, decoding: str) -> list[Finding]:
    want = DECODING_MODES.get(mode)
    if want and _set(decoding) and decoding != want:
        hint = " (all output ids come back 0, TensorRT-LLM#1449)" if decoding.startswith("top_") else ""
        if mode is SpecMode.EXPLICIT_DRAFT_TOKENS:
            hint = " (built with speculative_decoding_mode explicit_draft_tokens, which decoding_mode 'redrafter' " \
                   "decodes)"
        return [Finding("error", name, "decoding_mode", f"{decoding!r} on a {want} engine{hint}; set {want!r}")]
    if want and not _set(decoding):
        return [Finding("warning", name, "decoding_mode", f"unset on a {want} engine: TensorRT-LLM switches with "
                                                          f"only a warning; set {want!r}")]
    if not want and decoding in ("medusa", "eagle", "lookahead", "redrafter"):
        need = " ('redrafter' decodes an engine built with explicit_draft_tokens, from a ReDrafter checkpoint)" \
            if decoding == "redrafter" else ""
        return [Finding("error", name, "decoding_mode", f"{decoding!r} but the engine was built with "
                                                        f"speculative_decoding_mode {mode.flag or 'none'}{need}")]
    return []


def _check_redrafter(name: str, engine: TrtllmEngineConfig) -> list[Finding]:
    """The engine against trtspec's manifest beside it: method redrafter exactly when the engine was built with
    explicit_draft_tokens, and the beam search the manifest records is the one in the engine's pretrained_config,
    which the C++ runtime sizes its K by (TensorRT-LLM gptJsonConfig.cpp: num_beams x draft_len_per_beam)."""
    method = _manifest_field(engine.path, "method")
    explicit = engine.mode is SpecMode.EXPLICIT_DRAFT_TOKENS
    if not isinstance(method, str) or (method != "redrafter" and not explicit):  # no manifest, or no ReDrafter
        return []
    if (method == "redrafter") != explicit:
        return [Finding("error", name, "speculative_decoding_mode", f"the engine {engine.path} was built with "
                        f"{engine.mode.flag or 'none'}, its manifest.json says method {method} (explicit_draft_tokens "
                        "is method redrafter): the engine is not the one trtspec planned; rebuild it with "
                        "`trtspec build`")]
    beams = _manifest_field(engine.path, "redrafter") or {}
    pre = engine.pretrained
    built = (pre.get("redrafter_num_beams"), pre.get("redrafter_draft_len_per_beam"))
    planned = (beams.get("num_beams"), beams.get("draft_len_per_beam"))
    if built != planned:
        return [Finding("error", name, "redrafter", f"the engine's config.json has redrafter_num_beams x "
                        f"redrafter_draft_len_per_beam = {built[0]} x {built[1]}, its manifest.json {planned[0]} x "
                        f"{planned[1]}: the engine is not the one trtspec planned; rebuild it with `trtspec build`")]
    return []


def _check_tree(name: str, params: dict, engine: TrtllmEngineConfig) -> list[Finding]:
    if engine.mode not in (SpecMode.MEDUSA, SpecMode.EAGLE):
        return []
    key = "medusa_choices" if engine.mode is SpecMode.MEDUSA else "eagle_choices"
    text = params.get(key, "")
    if _set(text) and "[" in text:  # tensorrtllm_backend tensorrt_llm/config.pbtxt: the C++ backend parses nothing and falls back silently
        return [Finding("error", name, key, f"written in Python list syntax, which the C++ backend ignores "
                                            f"(it serves mc_sim_7b_63 instead); write {cpp_choices([[0], [0, 0]])}"
                                            f"-style brace groups: {cpp_choices(parse_choices(text))[:60]}...")]
    source = f"{key} (the default mc_sim_7b_63, since it is unset)" if not _set(text) else key
    try:
        tree = build_tree(parse_choices(text) if _set(text) else preset(DEFAULT_TREE[Backend.TRTLLM]))
    except TrtspecError as e:
        return [Finding("error", name, key, f"{source} is not a valid tree: {e}")]
    problem = _tree_problem(tree, engine)
    if problem:  # tensorrtllm_backend#473, FasterDecoding/Medusa#76: fails inside the engine at request time
        return [Finding("error", name, key, f"{source} does not fit the engine {engine.path}: {problem}; set {key} "
                                            "to a tree that fits (`trtspec deploy` writes the engine's own)")]
    return []


def _tree_problem(tree, engine: TrtllmEngineConfig) -> str | None:
    """What keeps the engine from running `tree`: a Medusa head per level; TensorRT-LLM's EAGLE-1 drafts exactly
    num_eagle_layers levels, at most max_non_leaves_per_layer expanding nodes each (TensorRT-LLM
    tensorrt_llm/llmapi/llm_args.py); no more nodes than max_draft_len."""
    pre = engine.pretrained
    heads, layers, widest = pre.get("num_medusa_heads"), pre.get("num_eagle_layers"), \
        pre.get("max_non_leaves_per_layer")
    if engine.mode is SpecMode.MEDUSA and isinstance(heads, int) and tree.depth > heads:
        return f"tree depth {tree.depth} exceeds the {heads} Medusa heads (one per level)"
    if engine.mode is SpecMode.EAGLE and isinstance(layers, int) and tree.depth != layers:
        return f"EAGLE-1 needs tree depth == num_eagle_layers = {layers}, but the tree has depth {tree.depth}"
    if engine.mode is SpecMode.EAGLE and isinstance(widest, int):
        for level, count in enumerate(tree.non_leaves_per_level()):
            if count > widest:
                return f"tree level {level} has {count} non-leaf nodes, above max_non_leaves_per_layer {widest}"
    if tree.num_nodes > engine.max_draft_len:
        return f"{tree.num_nodes} tree nodes, more than the engine's max_draft_len {engine.max_draft_len}"
    return None


def _check_lookahead(name: str, params: dict, engine: TrtllmEngineConfig) -> list[Finding]:
    keys = ("lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size")
    values = [params.get(k, "") for k in keys]
    if engine.mode is not SpecMode.LOOKAHEAD:
        return []
    if not all(_set(v) for v in values):  # tensorrtllm_backend tensorrt_llm/config.pbtxt: required with decoding_mode lookahead (the C++ backend throws)
        return [Finding("error", name, "lookahead_*", "a lookahead engine needs all three of "
                                                      f"{', '.join(keys)}")]
    try:
        la = Lookahead(*(int(v) for v in values))
    except (ValueError, TrtspecError) as e:
        return [Finding("error", name, "lookahead_*", f"invalid (W, N, G) {values}: {e}")]
    if la.max_draft_len != engine.max_draft_len:  # tensorrtllm_backend#710 ("16 != 40")
        return [Finding("error", name, "lookahead_*", f"(W, N, G) = ({', '.join(values)}) needs max_draft_len "
                                                      f"{la.max_draft_len}, the engine has {engine.max_draft_len}; the "
                                                      "server asserts at start. Rebuild or change (W, N, G)")]
    return []


def _check_engine_limits(name: str, model: dict, params: dict, engine: TrtllmEngineConfig) -> list[Finding]:
    out = []
    add = lambda sev, field, msg: out.append(Finding(sev, name, field, msg))  # noqa: E731
    build, pre = engine.build, engine.pretrained
    if engine.mode is SpecMode.MEDUSA and pre.get("max_draft_len") != build.get("max_draft_len"):
        add("error", "engine max_draft_len", f"pretrained_config says {pre.get('max_draft_len')}, build_config "
                                             f"{build.get('max_draft_len')}; the Medusa runtime reads the former "
                                             "(TensorRT-LLM tensorrt_llm/builder.py Engine.save)")
    batch = int(model.get("max_batch_size", 0))
    if build.get("max_batch_size") and batch > build["max_batch_size"]:  # tensorrtllm_backend#130
        add("warning", "max_batch_size", f"{batch} exceeds the engine's max_batch_size {build['max_batch_size']}, "
                                         "which is what governs; lower it to match")
    beams = params.get("max_beam_width", "1")
    if engine.mode is not SpecMode.NONE and _set(beams) and beams != "1":  # TensorRT-LLM tensorrt_llm/builder.py, tensorrtllm_backend#115
        add("error", "max_beam_width", f"{beams}: beam search cannot be combined with draft tokens; set 1")
    logits = next((o for o in model.get("output", []) if o.get("name") == "generation_logits"), None)
    want = TYPE_OF_DTYPE.get(pre.get("logits_dtype", "float32"))
    if logits is not None and logits.get("data_type") not in (want, "TYPE_INVALID", None):  # tensorrtllm_backend tensorrt_llm/config.pbtxt logits_datatype
        add("error", "logits_datatype", f"{logits.get('data_type')} but the engine's logits_dtype is "
                                        f"{pre.get('logits_dtype', 'float32')} ({want}); the backend checks equality")
    chunked = params.get("enable_chunked_context", "")
    if chunked in TRUE and not build.get("plugin_config", {}).get("use_paged_context_fmha", False):
        add("error", "enable_chunked_context", "needs an engine built with --use_paged_context_fmha enable")
    if params.get("speculative_decoding_fast_logits", "") in TRUE and not _set(params.get("participant_ids")):
        add("warning", "speculative_decoding_fast_logits", "silently disabled without orchestrator mode and "
                                                           "participant_ids (tensorrtllm_backend tensorrt_llm/config.pbtxt)")
    out += _check_version(name, engine)
    return out


def _check_version(name: str, engine: TrtllmEngineConfig) -> list[Finding]:
    version, installed = engine.config.get("version"), installed_version()
    manifest = engine.path / "manifest.json"
    out = []
    if installed and isinstance(version, str) and _minor(installed) != _minor(version):  # tensorrtllm_backend#662
        out.append(Finding("error", name, "engine version", f"built by TensorRT-LLM {version}, this container has "
                                                             f"{installed}; rebuild the engine here"))
    if manifest.is_file() and isinstance(version, str):
        planned = json.loads(manifest.read_text()).get("versions", {}).get("tensorrt_llm")
        if planned and _minor(planned) != _minor(version):
            out.append(Finding("error", name, "engine version", f"manifest.json says TensorRT-LLM {planned}, the "
                                                                f"engine config.json {version}; rebuild with trtspec"))
    return out


def _minor(text: str) -> tuple[int, int]:
    try:
        return parse_version(text).key
    except TrtspecError:
        return tuple(int(x) for x in re.findall(r"\d+", text)[:2])  # outside trtspec's range, still comparable


# ---- the Python models and the wiring -----------------------------------------------------------------

def check_preprocessing(models: dict[str, dict]) -> list[Finding]:
    out = []
    for name in ("preprocessing", "postprocessing"):
        params = _params(models.get(name, {}))
        if "tokenizer_type" in params:  # tensorrtllm_backend#364
            out.append(Finding("warning", name, "tokenizer_type", "removed in v0.9; fill_template.py v0.19+ asserts "
                                                                  "on it. Delete the parameter"))
        tokenizer = params.get("tokenizer_dir", "")
        if name in models and _set(tokenizer) and not _tokenizer_path(models[name], tokenizer,
                                                                       is_cpu_flavour(models)).is_dir():
            out.append(Finding("error", name, "tokenizer_dir", f"{tokenizer} does not exist; the model fails to load"))
    return out


def _tokenizer_path(model: dict, tokenizer: str, cpu_flavour: bool) -> Path:
    """As the model reads it: trtspec's CPU-flavour models resolve a relative path against the model's folder
    (triton/model_args.py); upstream's preprocessing hands it to AutoTokenizer as written."""
    path = Path(tokenizer)
    return path if path.is_absolute() or not cpu_flavour else Path(model["_dir"]) / path


def is_cpu_flavour(models: dict[str, dict]) -> bool:
    """trtspec's CPU flavour: an engine model on the python backend with an `engine_dir` parameter."""
    return any(m.get("backend") == "python" and "engine_dir" in _params(m) for m in models.values())


def _same_engine(engine_dir: Path, manifest) -> bool:
    """The ENGINE given and the repository's engine (e.g. a copy, deploy --copy-engine) have the same manifest."""
    from trtspec.engine.manifest import read_manifest

    try:
        return read_manifest(engine_dir).to_dict() == manifest.to_dict()
    except TrtspecError:
        return False


def check_cpu_engine(models: dict[str, dict], repo: Path, engine_dir: Path | None,
                     checked: list[Checked] | None = None) -> list[Finding]:
    """trtspec's CPU flavour: each engine model (python backend, `engine_dir` parameter) loads a trtspec engine whose
    files are as built (sizes, and content hashes as `trtspec serve` checks them), finds the compiled ops it runs,
    runs the method it asks for, finds its datastore, and asks for no more threads than cores. Each of these that
    holds is appended to `checked`."""
    import os

    from trtspec.engine.manifest import read_manifest
    from trtspec.triton.model_args import repository_path

    out, cores = [], os.cpu_count() or 1
    checked = [] if checked is None else checked
    for name, model in models.items():
        params = _params(model)
        if model.get("backend") != "python" or "engine_dir" not in params:
            continue
        ok = lambda what, result: checked.append(Checked(name, what, result))  # noqa: E731
        path = repository_path(repo, params["engine_dir"])
        try:
            manifest = read_manifest(path)
        except TrtspecError as e:
            out.append(Finding("error", name, "engine_dir", f"{e}; the model fails to load"))
            continue
        ok("engine", f"{path}: its manifest (method {manifest.method.value}, K {manifest.profile.max_draft_len}) and "
                     "every file it lists, at its recorded size")
        if engine_dir is not None and Path(engine_dir).resolve() != path and not _same_engine(engine_dir, manifest):
            out.append(Finding("warning", name, "engine_dir", f"loads {path}, not the ENGINE given ({engine_dir})"))
        out += _check_cpu_hashes(name, path, manifest, ok)
        out += _check_cpu_native_ops(name, path, manifest, ok)
        w = manifest.weights
        if any(f is not None and f.dtype.value != "fp32" for f in (w.linear, w.lm_head, w.embedding, w.drafter)):
            out.append(Finding("note", name, "weights", ", ".join(f"{k} {v}" for k, v in w.summary().items())))
        method = params.get("method", "auto")
        methods = manifest.runnable_methods()
        if method not in ("", "auto") and method not in methods:
            out.append(Finding("error", name, "method", f"{method!r} does not run on {path} (it runs "
                                                         f"{', '.join(methods)}); requests fail"))
        else:
            what = f"{method}" if method not in ("", "auto") else f"auto (the engine's own, {manifest.method.value})"
            ok("method", f"{what} runs on the engine (it runs {', '.join(methods)})")
        datastore = params.get("datastore", "")
        if datastore and not repository_path(repo, datastore).is_file():
            out.append(Finding("error", name, "datastore", f"{datastore} does not exist; the model fails to load"))
        elif datastore:
            ok("datastore", f"{datastore} is there")
        asked = int(params.get("threads", "0") or 0)
        threads = asked or cores
        instances = sum(int(g.get("count", 1)) for g in model.get("instance_group", [])) or 1
        if threads * instances > cores:
            out.append(Finding("warning", name, "threads", f"{instances} instance(s) x {threads} threads on "
                                                           f"{cores} cores: the instances take each other's cores "
                                                           "(`trtspec deploy --threads N` with N x instances <= cores)"))
        else:
            from trtspec.model.ort_session import threads_text

            ok("threads", f"{threads_text(asked)} per instance, {instances} instance(s), {cores} cores")
    return out


def _check_cpu_hashes(name: str, path: Path, manifest, ok) -> list[Finding]:
    """Every file's content hash against the manifest's, as `trtspec serve` checks them before it starts."""
    from trtspec.engine.integrity import HASH, verify_files

    if not manifest.checksums:
        ok("hashes", "none recorded (an engine built before trtspec recorded them): not checked")
        return []
    try:
        read = verify_files(path, manifest.checksums)
    except TrtspecError as e:
        return [Finding("error", name, "engine_dir", f"{e}; `trtspec serve` refuses the repository")]
    ok("hashes", f"{len(manifest.checksums)} files as built ({HASH}, {read / 2**20:.1f} MiB read)")
    return []


def _check_cpu_native_ops(name: str, path: Path, manifest, ok) -> list[Finding]:
    """The engine's own kernels need trtspec's compiled ops, built on this machine."""
    if not manifest.native_ops:
        ok("compiled ops", "none needed (ONNX Runtime's own ops only)")
        return []
    from trtspec import native

    ops = " and ".join(manifest.native_ops)
    try:
        library = native.library_path()
    except TrtspecError as e:
        return [Finding("error", name, "engine_dir", f"{path} runs {ops}: {e}; the model fails to load")]
    ok("compiled ops", f"{ops} from {library}")
    return []


def check_ensemble(models: dict[str, dict]) -> list[Finding]:
    """Every step's tensors exist on its model, every consumed tensor is produced earlier (renames, TensorRT-LLM triton_backend/all_models/), and
    no step mixes a decoupled model's outputs with another model's (server#7275, tensorrtllm_backend ensemble/config.pbtxt)."""
    ensemble = next((m for m in models.values() if m.get("platform") == "ensemble"), None)
    if ensemble is None:
        return []
    name, out = ensemble["name"], [_request_names(ensemble)]
    origin: dict[str, tuple[str, bool] | None] = {t["name"]: None for t in ensemble.get("input", [])}
    for step in ensemble.get("ensemble_scheduling", {}).get("step", []):
        model = models.get(step["model_name"])
        if model is None:
            out.append(Finding("error", name, step["model_name"], "step names a model the repository lacks"))
            continue
        out += _check_step(name, model, step, origin)
    for tensor in ensemble.get("output", []):
        if tensor["name"] not in origin:
            out.append(Finding("error", name, tensor["name"], "ensemble output that no step produces"))
    return out


def _check_step(name: str, model: dict, step: dict, origin: dict) -> list[Finding]:
    """origin: tensor → (producing model, whether a decoupled model is upstream of it), None for ensemble inputs."""
    out, model_name = [], model["name"]
    inputs, outputs = {t["name"] for t in model.get("input", [])}, {t["name"] for t in model.get("output", [])}
    sources = []
    for key, value in step.get("input_map", {}).items():
        if key not in inputs:
            out.append(Finding("error", name, f"{model_name}.{key}",
                               f"mapped from {value!r} but {model_name} has no input {key!r} (a renamed tensor, "
                               "e.g. min_length vs min_tokens?)"))
        if value not in origin:
            out.append(Finding("error", name, f"{model_name}.{key}", f"reads {value!r}, which no ensemble input or "
                                                                     "earlier step provides"))
        elif origin[value] is not None:
            sources.append(origin[value])
    producers = {producer for producer, _ in sources}
    if len(producers) > 1 and any(decoupled for _, decoupled in sources):
        out.append(Finding("error", name, model_name, f"reads outputs of {', '.join(sorted(producers))}, one of "
                                                      "them decoupled; Triton rejects the ensemble (server#7275). Feed "
                                                      "it from the decoupled model only"))
    decoupled = model.get("model_transaction_policy", {}).get("decoupled", False) or any(d for _, d in sources)
    for key, value in step.get("output_map", {}).items():
        if key not in outputs:
            out.append(Finding("error", name, f"{model_name}.{key}", f"{model_name} has no output {key!r}"))
        origin[value] = (model_name, decoupled)
    return out


def check_bls(models: dict[str, dict], llms: dict[str, dict], repo: Path, engine_dir: Path | None,
              findings: list[Finding]) -> list[Finding]:
    bls = next((m for m in models.values() if m.get("backend") == "python"
                and "tensorrt_llm_model_name" in _params(m)), None)
    if bls is None:
        return []
    params, out, name = _params(bls), [], bls["name"]
    target_name = params.get("tensorrt_llm_model_name") if _set(params.get("tensorrt_llm_model_name")) \
        else "tensorrt_llm"
    draft_name = params.get("tensorrt_llm_draft_model_name", "")
    bls_decoupled = bls.get("model_transaction_policy", {}).get("decoupled", False)
    for llm_name in [target_name] + ([draft_name] if _set(draft_name) else []):
        llm = models.get(llm_name)
        if llm is None:
            out.append(Finding("error", name, "tensorrt_llm_model_name" if llm_name == target_name
                               else "tensorrt_llm_draft_model_name", f"names {llm_name!r}, not in the repository"))
            continue
        if llm.get("model_transaction_policy", {}).get("decoupled", False) != bls_decoupled:  # tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py
            out.append(Finding("error", name, "decoupled",
                               f"{'true' if bls_decoupled else 'false'} but {llm_name} differs; keep decoupled_mode "
                               "identical on both (tensorrtllm_backend#62)"))
    if not _set(draft_name):
        return out
    target = _engine(target_name, models[target_name], engine_dir, []) if target_name in models else None
    draft = _engine(draft_name, models[draft_name], None, []) if draft_name in models else None
    if target is not None and target.mode is not SpecMode.DRAFT_TOKENS_EXTERNAL:  # tensorrtllm_backend#473
        out.append(Finding("error", target_name, "speculative_decoding_mode", "the BLS sends draft tokens but the "
                           "target engine was not built with --speculative_decoding_mode draft_tokens_external: "
                           "\"Number of draft tokens (N) is larger than maximum number of draft tokens (0)\""))
    if target is not None and draft is not None and \
            target.pretrained.get("vocab_size") != draft.pretrained.get("vocab_size"):
        out.append(Finding("error", draft_name, "vocab_size",
                           f"{draft.pretrained.get('vocab_size')} vs the target's "
                           f"{target.pretrained.get('vocab_size')}: draft and target must share a tokenizer"))
    for llm_name in (target_name, draft_name):
        llm_params = _params(models.get(llm_name, {}))
        if llm_name in models and llm_params.get("enable_kv_cache_reuse", "true") not in TRUE:  # tensorrtllm_backend docs/medusa.md, docs/eagle.md, docs/lookahead.md
            out.append(Finding("warning", llm_name, "enable_kv_cache_reuse", "off: every draft-target step resends "
                                                                             "the whole sequence; set true"))
        if llm_name in models and llm_params.get("exclude_input_in_output") in TRUE and not _trtspec_bls(repo, name):
            out.append(Finding("warning", llm_name, "exclude_input_in_output",
                               "true: upstream's v0.19 BLS then reads wrong or empty draft tokens (tensorrtllm_backend tensorrt_llm_bls/1/lib/decode.py)"))
    return out


def _trtspec_bls(repo: Path, name: str) -> bool:
    source = repo / name / "1" / "model.py"
    return source.is_file() and "trtspec BLS" in source.read_text(errors="replace")


def _request_names(ensemble: dict) -> Finding:
    """Which spelling of the two renamed request tensors the ensemble takes: min_length / random_seed up to
    TensorRT-LLM 0.19, min_tokens / seed from 0.20 (trtllm_versions.TrtllmVersion.newest_input_names)."""
    inputs = {t["name"] for t in ensemble.get("input", [])}
    old, new = {"min_length", "random_seed"} & inputs, {"min_tokens", "seed"} & inputs
    if old and new:
        names = "both min_length / random_seed and min_tokens / seed (clients of any TensorRT-LLM release work)"
    elif new:
        names = "min_tokens / seed (TensorRT-LLM >= 0.20 clients; 0.15-0.19 clients send min_length / random_seed)"
    elif old:
        names = "min_length / random_seed (TensorRT-LLM 0.15-0.19 clients; >= 0.20 clients send min_tokens / seed)"
    else:
        names = "neither min_length / random_seed nor min_tokens / seed"
    return Finding("note", ensemble["name"], "request tensors", f"takes {names}")


def report(findings: list[Finding], checked: list[Checked] = ()) -> dict:
    return {"errors": sum(f.severity == "error" for f in findings),
            "warnings": sum(f.severity == "warning" for f in findings),
            "notes": sum(f.severity == "note" for f in findings),
            "findings": [asdict(f) for f in findings], "checked": [asdict(c) for c in checked]}
