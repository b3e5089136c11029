"""`trtspec doctor REPO` on an llmapi repository (`deploy --flavour llmapi`, or tensorrtllm_backend's llmapi layout
made by hand): each model whose version folder holds a `model.yaml`.

What the LLM API would refuse or get wrong when the GPU host loads the model, one finding per problem: keys the
recorded TensorRT-LLM version does not take (`llmapi_versions`: speculative_config's fields are each held class's
whole list, an unknown one fails the pydantic model; the top-level and kv_cache_config lists hold only what trtspec
writes, so another key there is a warning to check by hand), a missing `triton_config`, the `model` and
`speculative_model` folders (checked where they exist here; elsewhere they are the GPU host's paths, a warning), and
when both exist the drafter against the base (`llmapi_check`). Each check that holds is listed as checked.
"""

from __future__ import annotations

import re
from pathlib import Path

from trtspec.errors import ConfigError
from trtspec.triton.doctor import Checked, Finding
from trtspec.triton.deploy_options import check_draft_len_schedule
from trtspec.triton.llmapi_check import check_drafter, eagle3_capture, mtp_layers
from trtspec.triton.llmapi_versions import DEFAULT, KV_CACHE, TOP_LEVEL, TRITON_CONFIG, VERSIONS, LlmapiVersion, \
    parse_llmapi_version

_RECORDED = re.compile(r"^#\s*trtspec llmapi version:\s*(\S+)", re.MULTILINE)
_WRITTEN_FOR = re.compile(r"^#.*\bfor TensorRT-LLM (\d+\.\d+)\b", re.MULTILINE)  # the first slice's header
_DRAFTERS = {"Eagle3": "eagle3", "MTP": "mtp", "NGram": "ngram", "DraftTarget": "draft_target"}
_OLD_FIELDS = {"speculative_model_dir": "speculative_model", "pytorch_weights_path": "speculative_model"}


def llmapi_models(repo: Path) -> list[Path]:
    """The model.yaml files of `repo`'s models (MODEL/1/model.yaml)."""
    return sorted(Path(repo).glob("*/1/model.yaml"))


def check_llmapi(repo: Path, checked: list[Checked] | None = None) -> list[Finding]:
    """Every problem of each llmapi model in `repo`; what holds is appended to `checked`."""
    checked = [] if checked is None else checked
    findings: list[Finding] = []
    for path in llmapi_models(repo):
        findings += _check_model(path, checked)
    return findings


def _check_model(path: Path, checked: list[Checked]) -> list[Finding]:
    import yaml

    name = path.parent.parent.name
    out: list[Finding] = []
    ok = lambda what, result: checked.append(Checked(name, what, result))  # noqa: E731
    text = path.read_text(errors="replace")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        return [Finding("error", name, "model.yaml", f"not YAML ({str(e).splitlines()[0]}); the model fails to load")]
    if not isinstance(doc, dict):
        return [Finding("error", name, "model.yaml", f"expected a mapping of LLM arguments, found "
                                                     f"{type(doc).__name__}; the model fails to load")]
    version, how = _version(text, name, out)
    ok("version", f"TensorRT-LLM {version.short} ({how}; keys held to {version.held_to})")
    out += _check_triton_config(name, doc, ok)
    out += _check_keys(name, doc, version, ok)
    base = _check_folder(name, "model", doc.get("model"), ok, out)
    spec = doc.get("speculative_config") if isinstance(doc.get("speculative_config"), dict) else None
    if spec is None:
        return out
    drafter = _DRAFTERS.get(spec.get("decoding_type"))
    draft = None
    if drafter in ("eagle3", "draft_target"):
        if spec.get("speculative_model") is None:
            out.append(Finding("error", name, "speculative_config.speculative_model",
                               f"{spec.get('decoding_type')} needs the draft's folder; the model fails to load"))
        else:
            draft = _check_folder(name, "speculative_config.speculative_model", spec["speculative_model"], ok, out)
    if base is None or drafter is None or (drafter in ("eagle3", "draft_target") and draft is None):
        return out
    out += _check_drafter(name, base, drafter, draft, spec, ok)
    return out


def _version(text: str, name: str, out: list[Finding]) -> tuple[LlmapiVersion, str]:
    match = _RECORDED.search(text) or _WRITTEN_FOR.search(text)
    if match is None:
        out.append(Finding("warning", name, "model.yaml", f"records no TensorRT-LLM version (trtspec deploy writes "
                                                          f"'# trtspec llmapi version: X.Y'); its keys are checked "
                                                          f"against {VERSIONS[DEFAULT].name}"))
        return VERSIONS[DEFAULT], "none recorded: the newest held"
    try:
        return parse_llmapi_version(match[1]), "recorded in model.yaml"
    except ConfigError as e:
        out.append(Finding("warning", name, "model.yaml", f"records version {match[1]}: {e}; its keys are checked "
                                                          f"against {VERSIONS[DEFAULT].name}"))
        return VERSIONS[DEFAULT], f"{match[1]} recorded, not held: the newest held"


def _check_triton_config(name: str, doc: dict, ok) -> list[Finding]:
    config = doc.get("triton_config")
    if not isinstance(config, dict):
        return [Finding("error", name, "triton_config", "model.yaml has no triton_config mapping (max_batch_size, "
                                                        "decoupled); the model fails to load")]
    out = [Finding("error", name, f"triton_config.{key}", "missing; the model fails to load")
           for key in TRITON_CONFIG if key not in config]
    out += [Finding("warning", name, f"triton_config.{key}", f"not read (the model reads "
                                                              f"{', '.join(TRITON_CONFIG)})")
            for key in config if key not in TRITON_CONFIG]
    if not out:
        ok("triton_config", f"max_batch_size {config['max_batch_size']}, decoupled {config['decoupled']}")
    return out


def _check_keys(name: str, doc: dict, version: LlmapiVersion, ok) -> list[Finding]:
    out = []
    for key in doc:
        if key not in TOP_LEVEL and key != "triton_config":
            out.append(Finding("warning", name, key, f"not a key trtspec holds for {version.name} (it holds "
                                                     f"{', '.join(TOP_LEVEL)}); check that the version's LLM "
                                                     "takes it, or the model fails to load"))
    kv = doc.get("kv_cache_config")
    if kv is not None and not isinstance(kv, dict):
        out.append(Finding("error", name, "kv_cache_config", f"must be a mapping, found {kv!r}"))
    for key in kv if isinstance(kv, dict) else ():
        if key not in KV_CACHE:
            out.append(Finding("warning", name, f"kv_cache_config.{key}", f"not a KvCacheConfig field trtspec holds "
                                                                          f"({', '.join(KV_CACHE)}); check it "
                                                                          f"against {version.name}"))
    spec = doc.get("speculative_config")
    if spec is not None and not isinstance(spec, dict):
        out.append(Finding("error", name, "speculative_config", f"must be a mapping, found {spec!r}"))
    elif spec is not None:
        decoding = spec.get("decoding_type")
        if decoding not in version.decoding:
            held = ", ".join(version.decoding)
            out.append(Finding("error", name, "speculative_config.decoding_type",
                               f"{decoding!r} is not a decoding type trtspec holds for {version.name} ({held})"))
        else:
            fields = version.fields(decoding)
            for key in spec:
                if key not in fields:
                    hint = f" (this version calls it {_OLD_FIELDS[key]})" if key in _OLD_FIELDS else ""
                    out.append(Finding("error", name, f"speculative_config.{key}",
                                       f"{version.name} has no {decoding} field {key!r}{hint}; the model fails to "
                                       "load"))
        out += _check_schedule(name, spec)
    if not out:
        ok("keys", f"every key one {version.name} takes"
                   + (f" ({spec['decoding_type']}: {len(spec)} speculative_config fields)" if spec else ""))
    return out


def _check_schedule(name: str, spec: dict) -> list[Finding]:
    """draft_len_schedule as TensorRT-LLM validates it (check_draft_len_schedule): a schedule it refuses fails the
    model's load."""
    schedule = spec.get("draft_len_schedule")
    if schedule is None:
        return []
    field = "speculative_config.draft_len_schedule"
    if not isinstance(schedule, dict) or not all(isinstance(k, int) and isinstance(v, int)
                                                 for k, v in schedule.items()):
        return [Finding("error", name, field, f"must map batch sizes to draft lengths, found {schedule!r}")]
    k = spec.get("max_draft_len", spec.get("num_nextn_predict_layers"))
    if not isinstance(k, int):
        return []
    try:
        check_draft_len_schedule(schedule, k, what="draft_len_schedule")
    except ConfigError as e:
        return [Finding("error", name, field, f"{e}; the model fails to load")]
    return []


def _check_folder(name: str, field: str, value, ok, out: list[Finding]) -> Path | None:
    """The folder when it is on this machine with a config.json; a finding otherwise."""
    if not isinstance(value, str) or not value:
        out.append(Finding("error", name, field, f"must name a Hugging Face folder, found {value!r}"))
        return None
    path = Path(value)
    if not path.exists():
        kind = "a hub id or " if not path.is_absolute() and value.count("/") == 1 else ""
        out.append(Finding("warning", name, field, f"{value} is not on this machine: {kind}the GPU host's path, not "
                                                   "checked here (run doctor there to check it)"))
        return None
    if not (path / "config.json").is_file():
        out.append(Finding("error", name, field, f"{value} has no config.json; the LLM API cannot load it"))
        return None
    ok(field, f"{value}: config.json there")
    return path


def _check_drafter(name: str, base: Path, drafter: str, draft: Path | None, spec: dict, ok) -> list[Finding]:
    from trtspec.checkpoint.hf_config import read_json

    out = [Finding("error", name, "speculative_config", line) for line in check_drafter(base, drafter, draft)]
    config = read_json(base / "config.json")
    if drafter == "mtp" and not out:
        asked, has = spec.get("num_nextn_predict_layers"), mtp_layers(config)
        if isinstance(asked, int) and asked > has:
            out.append(Finding("note", name, "speculative_config.num_nextn_predict_layers",
                               f"{asked} drafts per step with the base's {has} MTP module(s): the last runs again "
                               "(MTP-Eagle)"))
    if drafter == "eagle3":
        severity, line = eagle3_capture(config, read_json(draft / "config.json"),
                                        spec.get("eagle3_layers_to_capture"))
        if severity == "note":
            ok("eagle3 layers", line)
        else:
            out.append(Finding(severity, name, "speculative_config.eagle3_layers_to_capture", line))
    if not any(f.severity == "error" for f in out):
        ok("drafter", f"{spec.get('decoding_type')} against the base {base}"
                      + (f" (draft {draft})" if draft is not None else "") + ": no mismatch")
    return out
