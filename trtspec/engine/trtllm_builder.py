"""`trtspec build --backend trtllm`, the run: execute the planned trtllm-build, check its output, write the manifest.

The engine dir has the same layout as the CPU backend's (engine files, tokenizer/, manifest.json written last), so
deploy and bench treat both alike. Where tensorrt_llm is not importable, `build` stops before writing anything
and says so; `build --plan-only` writes the engine dir without its engine files instead (the manifest with no
`files`, the plan in trtllm-plan.json, the tokenizer, the checkpoint view), which `deploy` and `doctor` take. An
engine dir produced by running the printed command by hand is adopted by running the same `trtspec build` again
(its config.json is checked against the plan, then the manifest is written).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from trtspec.engine.manifest import MANIFEST_FILE, Manifest
from trtspec.engine.trtllm_plan import CheckpointView, TrtllmBuildOptions, TrtllmPlan, plan_trtllm_build
from trtspec.engine.trtllm_versions import installed_version, parse_version
from trtspec.errors import BuildError
from trtspec.outdir import atomic_output_dir, check_output_dir

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str], Path], None]  # (argv, working dir) → runs trtllm-build or raises BuildError
PLAN_FILE = "trtllm-plan.json"  # a planned engine dir's plan: the command, the configs, the engine config expected


def trtllm_available() -> bool:
    """Whether this Python can run trtllm-build (the tensorrt_llm package and its console script)."""
    return importlib.util.find_spec("tensorrt_llm") is not None and shutil.which("trtllm-build") is not None


def build(opts: TrtllmBuildOptions, *, runner: Runner | None = None, log_notes: bool = True) -> Manifest:
    """Plan, run trtllm-build into a staging dir, check its config.json against the plan, write the manifest
    (log_notes=False: the caller has shown the plan's notes)."""
    plan = plan_trtllm_build(opts)
    for note in plan.notes if log_notes else ():
        log.warning(note)
    if runner is None:
        if _adoptable(Path(opts.out)):
            return adopt(opts, plan)
        _check_installed(plan)
        runner = run_trtllm_build
    force = opts.force or is_planned(Path(opts.out))  # a plan of trtspec's own is replaced by its engine
    check_output_dir(Path(opts.out), force=force)
    quant = plan.quantization
    if quant is not None and quant.quantize_argv is not None and not (quant.checkpoint / "config.json").is_file():
        raise BuildError(f"--weights {quant.weights}: no quantized checkpoint at {quant.checkpoint} yet; run "
                         f"`{' '.join(quant.quantize_argv)}` first (the plan's quantize step), then this build again")
    _check_rank_files(opts.source if quant is None else quant.checkpoint, plan.manifest.world_size)
    with atomic_output_dir(Path(opts.out), force=force) as staging:
        argv = _with_output_dir(plan.argv, staging)
        if plan.checkpoint_view is not None:
            view = write_checkpoint_view(plan.checkpoint_view, staging)
            argv[argv.index("--checkpoint_dir") + 1] = str(view)
        runner(argv, staging)
        return _finish(opts, plan, staging)


def write_plan(opts: TrtllmBuildOptions, plan: TrtllmPlan | None = None) -> Manifest:
    """`build --plan-only`: the engine dir without its engine files — the manifest (no `files`: the engine is
    planned), PLAN_FILE, the tokenizer and the checkpoint view — so `deploy` writes its repository and `doctor`
    checks it before a GPU host runs trtllm-build into the same folder (then the same `trtspec build` adopts it)."""
    plan = plan or plan_trtllm_build(opts)
    out = Path(opts.out)
    with atomic_output_dir(out, force=opts.force or is_planned(out)) as staging:
        if plan.checkpoint_view is not None:
            write_checkpoint_view(plan.checkpoint_view, staging)
        manifest = _with_tokenizer(opts, plan.manifest, staging)
        record = {**plan.to_dict(), "engine_files": expected_engine_files(manifest.world_size),
                  "engine_config": plan.engine_config}
        (staging / PLAN_FILE).write_text(json.dumps(record, indent=2) + "\n")
        manifest.write(staging)
    return manifest


def write_checkpoint_view(view: CheckpointView, into: Path) -> Path:
    """into/checkpoint: the checkpoint's config.json with the planned max_draft_len, its other files linked."""
    target = Path(into) / view.path.name
    target.mkdir()
    source = Path(view.source).resolve()
    config = _read_json(source / "config.json")
    config["max_draft_len"] = view.max_draft_len
    (target / "config.json").write_text(json.dumps(config, indent=4) + "\n")
    for path in sorted(source.iterdir()):
        if path.name != "config.json" and path.is_file():
            (target / path.name).symlink_to(path)
    return target


def expected_engine_files(world_size: int) -> list[str]:
    """What trtllm-build writes into an engine dir: config.json and one engine file per rank."""
    return ["config.json", *(f"rank{rank}.engine" for rank in range(world_size))]


def is_planned(engine_dir: Path) -> bool:
    """Whether `engine_dir` holds a planned TensorRT-LLM engine: its manifest (trtllm backend) lists no files."""
    path = Path(engine_dir) / MANIFEST_FILE
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and data.get("backend") == "trtllm" and not data.get("files")


def read_plan(engine_dir: Path) -> dict:
    """A planned engine dir's PLAN_FILE ({} when absent or unreadable)."""
    try:
        data = json.loads((Path(engine_dir) / PLAN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def adopt(opts: TrtllmBuildOptions, plan: TrtllmPlan) -> Manifest:
    """Check an engine dir written by running the planned command by hand, and give it its manifest."""
    log.info("found a trtllm-build output in %s; checking it against the plan", opts.out)
    return _finish(opts, plan, Path(opts.out))


def check_engine_config(engine_dir: Path, plan: TrtllmPlan) -> dict:
    """Compare the engine's config.json with the plan; BuildError names the field and both values."""
    path = Path(engine_dir) / "config.json"
    config = _read_engine_config(path)
    built = config["build_config"]
    for key, want in plan.build_config.items():
        if key == "plugin_config":
            for pkey, pwant in want.items():
                _expect(path, f"build_config.plugin_config.{pkey}", built.get("plugin_config", {}).get(pkey), pwant)
        elif key == "max_num_tokens":  # trtllm-build may clip it to max_batch_size * max_seq_len (TensorRT-LLM tensorrt_llm/builder.py)
            floor = plan.build_config["max_batch_size"] * (plan.build_config["max_draft_len"] + 1)
            got = built.get(key)
            if not isinstance(got, int) or not floor <= got <= want:
                raise BuildError(f"{path}: build_config.max_num_tokens={got!r}, planned {want} (at least {floor})")
        else:
            _expect(path, f"build_config.{key}", built.get(key), want)
    for key, want in plan.pretrained_config.items():
        _expect(path, f"pretrained_config.{key}", config["pretrained_config"].get(key), want)
    if plan.quantization is not None:
        got = (config["pretrained_config"].get("quantization") or {}).get("quant_algo")
        _expect(path, "pretrained_config.quantization.quant_algo", got, plan.quantization.quant_algo)
    engine_version = config.get("version")
    if isinstance(engine_version, str) and parse_version(engine_version).key != plan.version.key:
        raise BuildError(f"{path}: the engine was built by TensorRT-LLM {engine_version}, the plan targets "
                         f"{plan.version.text}; pass --trtllm-version {engine_version}")
    return config


def run_trtllm_build(argv: Sequence[str], cwd: Path) -> None:
    """Run trtllm-build, streaming its log to stderr (cwd = the staging dir: its timing cache lands there)."""
    log.info("running %s", " ".join(argv))
    tail: list[str] = []
    with subprocess.Popen(list(argv), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stderr.write(line)
            tail = (tail + [line.rstrip()])[-5:]
    if proc.returncode != 0:
        raise BuildError(f"trtllm-build exited with status {proc.returncode}: {' | '.join(tail) or 'no output'}")


# ---- helpers ------------------------------------------------------------------------------------------

def _finish(opts: TrtllmBuildOptions, plan: TrtllmPlan, engine_dir: Path) -> Manifest:
    config = check_engine_config(engine_dir, plan)
    files = {"config": "config.json"}
    for rank in range(plan.manifest.world_size):
        name = f"rank{rank}.engine"
        if not (engine_dir / name).is_file():
            raise BuildError(f"{engine_dir}: trtllm-build wrote no {name} (world_size {plan.manifest.world_size})")
        files[f"rank{rank}"] = name
    versions = dict(plan.manifest.versions)
    if isinstance(config.get("version"), str):
        versions["tensorrt_llm"] = config["version"]  # the version that actually built it
    manifest = _with_tokenizer(opts, replace(plan.manifest, files=files, versions=versions), engine_dir)
    manifest.write(engine_dir)
    return manifest


def _with_tokenizer(opts: TrtllmBuildOptions, manifest: Manifest, engine_dir: Path) -> Manifest:
    """The tokenizer copied into engine_dir (unless there already) and its end / pad ids in the manifest."""
    from trtspec.engine.onnx_builder import _copy_tokenizer, _special_ids, _tokenizer_dir

    tokenizer_dir = _tokenizer_dir(opts)
    end_id, pad_id = _special_ids(tokenizer_dir)
    tokenizer = None
    if tokenizer_dir is not None and not (engine_dir / "tokenizer").exists():
        tokenizer = _copy_tokenizer(tokenizer_dir, engine_dir)
    elif (engine_dir / "tokenizer" / "tokenizer.json").is_file():
        tokenizer = "tokenizer"
    return replace(manifest, tokenizer=tokenizer, model=replace(manifest.model, end_id=end_id, pad_id=pad_id))


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: unreadable ({e})") from None
    if not isinstance(data, dict):
        raise BuildError(f"{path}: not a JSON object")
    return data


def _read_engine_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise BuildError(f"{path.parent}: trtllm-build wrote no config.json") from None
    except (OSError, json.JSONDecodeError) as e:
        raise BuildError(f"{path}: unreadable engine config ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("build_config"), dict) \
            or not isinstance(config.get("pretrained_config"), dict):
        raise BuildError(f"{path}: not a TensorRT-LLM engine config (needs build_config and pretrained_config)")
    return config


def _expect(path: Path, field: str, got: object, want: object) -> None:
    if got != want:
        raise BuildError(f"{path}: {field}={got!r} but the plan asked for {want!r}; the engine does not match "
                         f"its build flags (wrong TensorRT-LLM version or a hand-edited command?)")


def _adoptable(out: Path) -> bool:
    return (out / "config.json").is_file() and (not (out / MANIFEST_FILE).exists() or is_planned(out)) \
        and any(out.glob("rank*.engine"))


def _check_installed(plan: TrtllmPlan) -> None:
    if not trtllm_available():
        where = f" (container {plan.version.container})" if plan.version.container else ""
        raise BuildError(f"tensorrt_llm is not importable here, so trtllm-build cannot run; the plan is valid. "
                         f"Run this `trtspec build` on a GPU host with TensorRT-LLM {plan.version.text}{where}; or add "
                         f"--plan-only here to write the engine dir without its engine files (`trtspec deploy` takes "
                         f"it), run the printed trtllm-build command on that host, then this `trtspec build` again "
                         f"to adopt its output")
    installed = installed_version()
    if installed and parse_version(installed).key != plan.version.key:
        raise BuildError(f"tensorrt_llm {installed} is installed but the plan targets {plan.version.text}; pass "
                         f"--trtllm-version {parse_version(installed).short}")


def _check_rank_files(source: Path, world_size: int) -> None:
    for rank in range(world_size):
        if not (Path(source) / f"rank{rank}.safetensors").is_file():
            raise BuildError(f"{source}: rank{rank}.safetensors is missing (the checkpoint's mapping has "
                             f"world_size {world_size}); reconvert it")


def _with_output_dir(argv: Sequence[str], out: Path) -> list[str]:
    argv = list(argv)
    argv[argv.index("--output_dir") + 1] = str(out)
    return argv
