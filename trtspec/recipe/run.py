"""`trtspec recipe run`: a recipe's stages in order, each into its own folder under the work dir.

convert, build and deploy run the exact `trtspec` commands `recipe check` prints, each in a child process (logs in
WORK/NAME/logs/STAGE.log), and are skipped when a stamp says their commands, inputs and trtspec's version are what they
were at their last success (a recipe of deploy.flavour llmapi has deploy alone: TensorRT-LLM's LLM API loads its
Hugging Face base on the GPU host; its serve and bench stages are skipped, saying why). serve and bench measure the
present, so they always run: serve starts the real server on free loopback ports and checks every greedy reply over
gRPC against in-process decoding of the same engine; bench measures the recipe's methods against plain decoding, or
with `gate` the baseline's slice, judged against its figures.

A stage's old output and stamp are removed before it runs, so a failing stage leaves the earlier stages' outputs intact
and its own absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import trtspec
from trtspec.errors import ConfigError, TrtspecError
from trtspec.recipe.schema import STAGES, Recipe, _join, load_recipe

log = logging.getLogger(__name__)

CACHED = ("convert", "build", "deploy")  # stages whose output a stamp vouches for
OUTPUT = {"convert": "checkpoint", "build": "engine", "deploy": "repository", "serve": "serve", "bench": "bench"}
# the file whose bytes stand for a stage's output in the next stage's stamp
FINGERPRINT = {"convert": "config.json", "build": "manifest.json", "deploy": None}


class StageError(TrtspecError):
    """A recipe stage failed; the message names the stage and the first error line of its command."""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    recipe_file: Path
    workdir: Path = Path("recipe-runs")
    stages: tuple[str, ...] | None = None  # default: every stage the recipe has
    force: bool = False  # run convert / build / deploy even when their stamps match
    dry_run: bool = False  # print the commands, run nothing
    gate: bool = False  # bench: measure the baseline slice and judge it
    update_baseline: bool = False  # bench --gate: write the measured figures into the recipe
    rehearse: bool = False  # a trtllm recipe's GPU repository run here (Recipe.rehearsal)


@dataclass
class StageOutcome:
    stage: str
    status: str  # ran, skipped, failed
    seconds: float = 0.0
    detail: str = ""


@dataclass
class RunReport:
    recipe: str
    outcomes: list[StageOutcome] = field(default_factory=list)
    seconds: float = 0.0
    gate: object | None = None  # gate.GateResult when --gate ran

    @property
    def passed(self) -> bool:
        return all(o.status != "failed" for o in self.outcomes) and (self.gate is None or self.gate.passed)


def selected_stages(recipe: Recipe, stages: tuple[str, ...] | None, *, gate: bool = False) -> tuple[str, ...]:
    if stages is None:
        return recipe.stages
    for s in stages:
        if s not in STAGES:
            raise ConfigError(f"--stages: unknown stage {s!r}; stages: {', '.join(STAGES)}")
        if s not in recipe.stages:
            section = "a bench or baseline" if s == "bench" else f"a {s}"
            raise ConfigError(f"--stages {s}: the recipe has no {s} stage (add {section} section)")
    if gate and "bench" not in stages:
        raise ConfigError("--gate judges the bench stage: pass --stages …,bench (or no --stages)")
    return tuple(s for s in STAGES if s in stages)


def dry_run_lines(recipe: Recipe, workdir: Path, stages: tuple[str, ...]) -> list[str]:
    commands = recipe.stage_commands(str(workdir))
    lines = []
    for stage in stages:
        lines.append(f"# {stage}")
        if recipe.skipped(stage):
            lines.append(f"# (skipped: {recipe.skipped(stage)})")
        if stage == "convert" and recipe.base.tiny is not None:
            lines.append(f"# (writes a tiny random base{' and ' + recipe.drafter.kind.value if recipe.drafter_path(str(workdir)) else ''} "
                         f"into {recipe.paths(str(workdir))['tiny']} with trtspec.testing)")
        lines += [_join(c) for c in commands.get(stage, [])]
    return lines


def run_recipe(opts: RunOptions, show=print) -> RunReport:
    """Run the recipe's stages; `show` gets one line per stage (and the bench's progress)."""
    recipe = load_recipe(opts.recipe_file)
    if opts.rehearse:
        recipe = recipe.rehearsal()
    if opts.update_baseline and not opts.gate:
        raise ConfigError("--update-baseline writes what --gate measures: pass --gate too")
    if opts.gate and recipe.baseline is None and not opts.update_baseline:
        raise ConfigError(f"{opts.recipe_file}: --gate needs a baseline section (or --update-baseline to write one)")
    if opts.gate and recipe.baseline is None:  # --update-baseline writes one from the bench section
        recipe = dataclasses.replace(recipe, baseline=_default_baseline(recipe))
    stages = selected_stages(recipe, opts.stages, gate=opts.gate)
    report = RunReport(recipe=recipe.name)
    start = time.perf_counter()
    root = Path(recipe.paths(str(opts.workdir))["root"])
    for i, stage in enumerate(stages, 1):
        t0 = time.perf_counter()
        try:
            status, detail = _run_stage(recipe, opts, stage, root, show)
        except TrtspecError as e:
            outcome = StageOutcome(stage, "failed", time.perf_counter() - t0, str(e))
            report.outcomes.append(outcome)
            show(f"[{i}/{len(stages)}] {stage:<8} failed after {outcome.seconds:.1f} s: {e}")
            break
        if isinstance(detail, tuple):  # the bench stage under --gate hands back the gate's result
            detail, report.gate = detail
        outcome = StageOutcome(stage, status, time.perf_counter() - t0, detail)
        report.outcomes.append(outcome)
        show(f"[{i}/{len(stages)}] {stage:<8} {status} in {outcome.seconds:.1f} s{': ' + detail if detail else ''}")
    report.seconds = time.perf_counter() - start
    return report


def _default_baseline(recipe: Recipe):
    from trtspec.recipe.schema import BaselineSection

    b = recipe.bench
    if b is None:
        raise ConfigError("--update-baseline with no baseline section needs a bench section to copy the slice from")
    return BaselineSection(prompt_sets=list(b.prompt_sets), limit=b.limit, max_tokens=b.max_tokens,
                           method=recipe.methods[0] if recipe.methods else None)


# ---- stamps -------------------------------------------------------------------------------------------------------


def stamp_path(root: Path, stage: str) -> Path:
    return root / "stamps" / f"{stage}.json"


def stage_key(recipe: Recipe, stage: str, root: Path, commands: list[list[str]]) -> str:
    """What a stage's output depends on: its commands, the recipe sections behind a tiny base, trtspec's version,
    and what the stage reads (the previous stage's stamp and the bytes of its output's manifest / config)."""
    # paths under the work dir count relative to it, so a moved work dir keeps its checkpoint and engine; not for
    # deploy: a repository names its engine by absolute path
    workdir = str(root.parent)
    relative = commands if stage == "deploy" else [[a.replace(workdir, "$WORKDIR") for a in c] for c in commands]
    inputs: dict = {"stage": stage, "commands": relative, "trtspec": trtspec.__version__}
    if stage == "convert":
        inputs["base"] = dataclasses.asdict(recipe.base)
        inputs["drafter"] = {k: (v.value if hasattr(v, "value") else v)
                             for k, v in dataclasses.asdict(recipe.drafter).items()}
        if recipe.base.path is not None:
            inputs["base_config"] = _file_digest(Path(recipe.base.path) / "config.json")
    elif recipe.flavour == "llmapi":  # deploy reads the Hugging Face folders themselves: no earlier stage
        inputs["base_config"] = _file_digest(Path(recipe.base.path) / "config.json")
        if recipe.deploy.draft_path:
            inputs["draft_config"] = _file_digest(Path(recipe.deploy.draft_path) / "config.json")
    else:
        previous = CACHED[CACHED.index(stage) - 1]
        inputs["after"] = _read_stamp(stamp_path(root, previous)).get("key")
        fingerprint = FINGERPRINT[previous]
        inputs["input"] = _file_digest(Path(recipe.paths(str(root.parent))[OUTPUT[previous]]) / fingerprint)
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def _file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def _read_stamp(path: Path) -> dict:
    """A stage's stamp, or {} when it is missing or unreadable (a corrupt stamp means: run the stage again)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError):
        log.warning("%s is unreadable; its stage runs again", path)
        return {}
    return data if isinstance(data, dict) and isinstance(data.get("key"), str) else {}


def _write_stamp(path: Path, key: str, seconds: float) -> None:
    from trtspec.outdir import atomic_output_file

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_output_file(path) as tmp:
        tmp.write_text(json.dumps({"key": key, "trtspec": trtspec.__version__, "seconds": round(seconds, 2),
                                   "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")


# ---- stages -------------------------------------------------------------------------------------------------------


def _run_stage(recipe: Recipe, opts: RunOptions, stage: str, root: Path, show) -> tuple[str, object]:
    paths = recipe.paths(str(opts.workdir))
    if recipe.skipped(stage):
        return "skipped", recipe.skipped(stage)
    if stage in CACHED:
        base = _base_folder(recipe) if stage == "convert" else None
        commands = recipe.stage_commands(str(opts.workdir), base=base)[stage]
        key = stage_key(recipe, stage, root, commands)
        stamp = stamp_path(root, stage)
        output = Path(paths[OUTPUT[stage]])
        if not opts.force and _read_stamp(stamp).get("key") == key and output.exists():
            return "skipped", "unchanged since its last run"
        stamp.unlink(missing_ok=True)
        for later in CACHED[CACHED.index(stage) + 1:]:
            stamp_path(root, later).unlink(missing_ok=True)
        _remove(output)
        if stage == "build" and recipe.drafter.kind.value == "draft_target":
            _remove(Path(paths["draft_engine"]))
        if stage == "build" and recipe.rehearse:
            _remove(Path(paths["cpu_engine"]))
            _remove(Path(paths["cpu_draft_engine"]))
        t0 = time.perf_counter()
        if stage == "convert" and recipe.base.tiny is not None:
            _write_tiny(recipe, Path(paths["tiny"]))
        for command in commands:
            _run_command(command, root / "logs" / f"{stage}.log", stage)
        _write_stamp(stamp, stage_key(recipe, stage, root, commands), time.perf_counter() - t0)
        return "ran", str(output)
    if stage == "serve" and recipe.rehearse:
        return "ran", _serve_rehearsal(recipe, Path(paths["repository"]), Path(paths["cpu_engine"]),
                                       Path(paths["serve"]))
    if stage == "serve":
        return "ran", _serve(recipe, Path(paths["repository"]), Path(paths["engine"]), Path(paths["serve"]))
    return "ran", _bench(recipe, opts, Path(paths["engine"]), Path(paths["bench"]), show)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _base_folder(recipe: Recipe) -> str | None:
    if recipe.base.fetch is None:
        return None
    from trtspec.hub.fetch import fetch_model

    return str(fetch_model(recipe.base.fetch))


def _write_tiny(recipe: Recipe, folder: Path) -> None:
    """The tiny random base (with a tiny tokenizer) and its random Medusa heads / EAGLE draft / ReDrafter drafter,
    seeded."""
    from trtspec.outdir import atomic_output_dir
    from trtspec.testing.factory import (TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads,
                                         write_redrafter_drafter)
    from trtspec.testing.tokenizers import write_tiny_tokenizer

    with atomic_output_dir(folder, force=True) as tmp:
        vocab = write_tiny_tokenizer(tmp / "base")
        fields = {"vocab_size": vocab, "max_position_embeddings": 4096, **recipe.base.tiny}
        model = TinyModel(**fields)
        write_hf_base(tmp / "base", model, seed=recipe.base.seed)
        kind = recipe.drafter.kind.value
        if kind == "medusa":
            write_medusa_heads(tmp / "medusa", model, seed=recipe.base.seed + 1)
        elif kind == "eagle":
            write_eagle_draft(tmp / "eagle", model, seed=recipe.base.seed + 2)
        elif kind == "redrafter":
            write_redrafter_drafter(tmp / "redrafter", model, seed=recipe.base.seed + 3)


def _run_command(command: list[str], log_file: Path, stage: str) -> None:
    """One `trtspec …` command in a child process (this interpreter, so the same installation), its output in
    `log_file`; a failure is a StageError carrying the command's own error line."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "trtspec.cli", *command[1:]]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log_file, "a") as f:
        start = f.tell()
        f.write(f"$ {_join(command)}\n")
        f.flush()
        code = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, env=env).returncode
    if code:
        with open(log_file) as f:
            f.seek(start)
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
        errors = [line for line in lines if line.lower().startswith("error")]
        reason = (errors or lines or ["no output"])[-1]
        # a GPU build where tensorrt_llm is missing: the plan's exact command is what the person runs next
        planned = next((line for line in lines if line.startswith("trtllm-build ")), None)
        then = f"; the command to run on the GPU host: {planned}" if planned else ""
        raise StageError(f"`{_join(command)}` exited {code}: {reason}{then} (log: {log_file})")


def _serve(recipe: Recipe, repository: Path, engine: Path, folder: Path) -> str:
    """The real server on free loopback ports: every prompt of the serve slice streamed over gRPC with the
    deployment's drafter, each greedy reply compared with plain in-process decoding of the same engine."""
    if recipe.flavour == "trtllm":
        raise StageError(f"serve: a trtllm-flavour repository runs in the TensorRT-LLM Triton container "
                         f"({repository}/launch_triton.sh), not here")
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    s = recipe.serve
    prompts = _serve_prompts(recipe)
    local = LocalGenerator(engine, threads=1)
    expected = [g.output_ids for g in local.generate_many(prompts, GenerationConfig(max_tokens=s.max_tokens,
                                                                                    no_spec=True))]
    rows = [{"prompt": i, "tokens": len(reply.output_ids), "identical": reply.output_ids == expected[i],
             "ttft_ms": round(reply.ttft_s * 1000, 1)}
            for i, reply in enumerate(_served_replies(recipe, repository, prompts, stream=True))]
    _serve_report(recipe, folder, rows, "replies over gRPC differ from in-process greedy decoding")
    return f"{len(rows)} streamed replies over gRPC, all identical to in-process greedy decoding"


def _serve_rehearsal(recipe: Recipe, repository: Path, cpu_engine: Path, folder: Path) -> str:
    """The rehearsed GPU repository in the real server: every prompt of the serve slice as a whole reply through the
    ensemble (the raw text, as upstream's clients send it), each reply the text the CPU engine decodes greedily in
    process after the prompt's ids, detokenized as upstream's postprocessing does."""
    from transformers import AutoTokenizer

    from trtspec.engine.manifest import read_manifest
    from trtspec.runtime.generator import LocalGenerator
    from trtspec.speculative.loop import GenerationConfig

    s = recipe.serve
    prompts = _serve_prompts(recipe)
    local = LocalGenerator(cpu_engine, threads=1)
    tokenizer = AutoTokenizer.from_pretrained(str(cpu_engine / read_manifest(cpu_engine).tokenizer))
    expected = [tokenizer.decode(local.generate(local.tokenizer.encode(p, add_special_tokens=True),
                                                GenerationConfig(max_tokens=s.max_tokens, no_spec=True)).output_ids,
                                 skip_special_tokens=True) for p in prompts]
    pair = recipe.drafter.kind.value == "draft_target"
    texts = (_draft_target_replies(repository, prompts, s.max_tokens, recipe.build.max_draft_len, s.wait_s) if pair
             else [reply.text for reply in _served_replies(recipe, repository, prompts, stream=False)])
    rows = [{"prompt": i, "identical": text == expected[i], "text": text} for i, text in enumerate(texts)]
    _serve_report(recipe, folder, rows, "replies of the GPU repository differ from the CPU engine's greedy decoding",
                  rehearsal=True)
    through = (f"tensorrt_llm_bls's draft-target loop ({recipe.build.max_draft_len} draft tokens a step)" if pair
               else "the ensemble")
    return (f"the GPU repository served here with {cpu_engine.name} as tensorrt_llm: {len(rows)} replies through "
            f"{through}, all the CPU engine's greedy text")


def _draft_target_replies(repository: Path, prompts: list[str], max_tokens: int, num_draft: int,
                          wait_s: float) -> list[str]:
    """Each prompt's generated text from `tensorrt_llm_bls` with num_draft_tokens (the pair's loop, unary as the
    BLS serves it; upstream's clients send the same tensors)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from trtspec.triton.client import TritonClient, infer_input
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    options = ServerOptions(repository=repository, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port())
    texts = []
    with TritonServer(options, on_log=lambda line: None) as server:
        TritonClient(server.grpc_url, model="tensorrt_llm_bls").check_ready(wait_s=wait_s)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        for prompt in prompts:
            inputs = [infer_input("text_input", np.array([[prompt.encode()]], np.object_)),
                      infer_input("max_tokens", np.array([[max_tokens]], np.int32)),
                      infer_input("num_draft_tokens", np.array([[num_draft]], np.int32)),
                      infer_input("exclude_input_in_output", np.array([[True]], np.bool_))]
            reply = client.infer("tensorrt_llm_bls", inputs)
            texts.append(reply.as_numpy("text_output").reshape(-1)[0].decode("utf-8", errors="replace"))
    return texts


def _serve_prompts(recipe: Recipe) -> list[str]:
    from trtspec.data.prompts import load_prompts

    return [p.text for p in load_prompts(recipe.serve.prompt_set, limit=recipe.serve.limit)]


def _served_replies(recipe: Recipe, repository: Path, prompts: list[str], *, stream: bool) -> list:
    """Each prompt's reply from `ensemble` of the repository served on free loopback ports (the serve slice's
    max_tokens, the deployment's drafter)."""
    from trtspec.speculative.loop import GenerationConfig
    from trtspec.triton.client import TritonClient
    from trtspec.triton.server import ServerOptions, TritonServer, free_port

    s = recipe.serve
    options = ServerOptions(repository=repository, grpc_port=free_port(), http_port=free_port(),
                            metrics_port=free_port())
    with TritonServer(options, on_log=lambda line: None) as server:
        with TritonClient(server.grpc_url, model="ensemble") as client:
            client.check_ready(wait_s=s.wait_s)
            return [client.generate(prompt, GenerationConfig(max_tokens=s.max_tokens), index=i, stream=stream)
                    for i, prompt in enumerate(prompts)]


def _serve_report(recipe: Recipe, folder: Path, rows: list[dict], differ: str, *, rehearsal: bool = False) -> None:
    """serve/report.json; a StageError when a reply is not what was expected (`differ` says what it should be)."""
    from trtspec.outdir import atomic_output_dir

    same = sum(r["identical"] for r in rows)
    report = {"prompt_set": recipe.serve.prompt_set, **({"rehearsal": True} if rehearsal else {}), "requests": rows,
              "identical": f"{same}/{len(rows)}"}
    with atomic_output_dir(folder, force=True) as tmp:
        (tmp / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if same != len(rows):
        stage = "serve (rehearsal)" if rehearsal else "serve"
        raise StageError(f"{stage}: {len(rows) - same} of {len(rows)} {differ} (report: {folder}/report.json)")


def _bench(recipe: Recipe, opts: RunOptions, engine: Path, folder: Path, show):
    from trtspec.outdir import atomic_output_dir
    from trtspec.recipe import gate

    if not opts.gate:  # `trtspec bench run` per prompt set: every method and concurrency, summary.json and plots
        from trtspec.bench.bench_outputs import format_table, write_outputs
        from trtspec.bench.runner import BenchOptions, run_bench

        b = recipe.bench
        with atomic_output_dir(folder, force=True) as tmp:
            for name in b.prompt_sets:
                run = run_bench(BenchOptions(engine=engine, prompt_set=name, limit=b.limit, methods=tuple(recipe.methods),
                                             concurrency=tuple(b.concurrency), temperature=b.temperature,
                                             max_tokens=b.max_tokens, threads=b.threads, spin=b.spin,
                                             draft_budget=recipe.deploy.draft_budget,
                                             show_progress=False), show=lambda line: log.info(line))
                write_outputs(run, tmp / name)
                for line in format_table(run.report):
                    show(f"  {line}")
        return f"{folder}/<prompt set>/summary.json, requests.csv, plots"
    method = recipe.baseline.method or recipe.methods[0]
    measured, full = gate.measure_slice(recipe, engine, show=lambda line: log.info(line))
    result = gate.judge(recipe.baseline, method, measured, full.get("load_average"))
    with atomic_output_dir(folder, force=True) as tmp:
        (tmp / "report.json").write_text(json.dumps(full, indent=2) + "\n")
        gate.write_report(result, tmp)
    for line in gate.format_table(result).splitlines():
        show(f"  {line}")
    if opts.update_baseline:
        b = recipe.baseline
        costs = next(iter(full["systems"].values()))["step_costs"]
        curve = {"profiles": costs["profiles"], "relative": costs["relative"]} if b.verify_curve is None else None
        gate.update_baseline(opts.recipe_file, method, measured,
                             {"prompt_sets": list(b.prompt_sets), "limit": b.limit, "max_tokens": b.max_tokens},
                             verify_curve=curve)
        show(f"  wrote the measured figures into {opts.recipe_file} (baseline.figures)")
    return (f"{folder}/gate.json, {folder}/gate.png", result)
