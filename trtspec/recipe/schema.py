"""Recipes: one YAML file names the base, the drafter and the convert / build / deploy / serve / bench settings of a
pipeline, and may carry the baseline its measurements are gated against.

A recipe is validated as a whole (unknown keys rejected with the valid ones listed, method-specific fields
required, backend and flavour consistent) and turns into the exact `trtspec` commands a person runs;
`trtspec recipe check FILE` prints them and `trtspec recipe run FILE` runs them (trtspec.recipe.run).

The paths a recipe names (PATH_FIELDS: the base and drafter folders, the datastores) are relative to the recipe
file's folder, wherever it is run from; `recipe check` says which of them do not exist.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import ConfigError, check_fields
from trtspec.speculative.method import Method

STAGES = ("convert", "build", "deploy", "serve", "bench")


Drafter = Method  # a recipe's drafter.kind: one of Method.recipe_drafters()


@dataclass(frozen=True, kw_only=True)
class BaseSection:
    path: str | None = None  # the Hugging Face base model folder convert reads
    fetch: str | None = None  # or a model `trtspec models fetch` installs (e.g. smollm2-135m)
    tiny: dict | None = None  # or a tiny random LLaMA (trtspec.testing.TinyModel fields) with a tiny tokenizer
    model: str | None = None  # where it comes from (a hub id, for people; nothing downloads it)
    seed: int = 0  # tiny: the seed of its random weights (and of its drafter's)

    def __post_init__(self):
        given = [k for k in ("path", "fetch", "tiny") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ConfigError("recipe base needs exactly one of path (a Hugging Face folder), fetch (a `trtspec "
                              f"models fetch` name) or tiny (a tiny random model){'; got ' + ', '.join(given) if given else ''}")
        if self.tiny is not None:
            if not isinstance(self.tiny, dict):
                raise ConfigError(f"recipe base.tiny must be a mapping of TinyModel fields ({{}} for the defaults), "
                                  f"got {self.tiny!r}")
            from trtspec.testing.factory import TinyModel

            check_fields(TinyModel, self.tiny, "recipe base.tiny", container="a mapping")


@dataclass(frozen=True, kw_only=True)
class DrafterSection:
    kind: Drafter = Drafter.NONE
    path: str | None = None  # Medusa heads / EAGLE draft folder; draft_target: the draft model's HF folder
    num_heads: int | None = None  # Medusa heads to convert (default: all stored)
    num_medusa_layers: int | None = None  # ResBlock layers per Medusa head (checked against the weights)
    num_eagle_layers: int = 4  # EAGLE tree depth
    max_non_leaves_per_layer: int = 10
    num_beams: int | None = None  # redrafter: beams of its search (default: the converter's 5)
    draft_len_per_beam: int | None = None  # redrafter: tokens per beam (default 5); K = beams x length
    window_size: int | None = None  # lookahead (W, N, G)
    ngram_size: int | None = None
    verification_set_size: int | None = None

    @property
    def lookahead(self) -> str | None:
        if self.window_size is None:
            return None
        return f"{self.window_size},{self.ngram_size},{self.verification_set_size}"


@dataclass(frozen=True, kw_only=True)
class ConvertSection:
    dtype: str | None = None
    tp_size: int = 1
    pp_size: int = 1
    max_draft_len: int | None = None  # Medusa / EAGLE: written into the checkpoint (the Medusa runtime reads it)


@dataclass(frozen=True, kw_only=True)
class BuildSection:
    backend: str = "onnx"
    trtllm_version: str | None = None
    max_batch_size: int = 8
    max_input_len: int = 1024
    max_seq_len: int | None = None
    max_draft_len: int | None = None  # K; with drafter none on the onnx backend: room for ngram / suffix drafts
    preset: str | None = None
    choices: str | None = None
    eagle2: str | None = None  # onnx: EAGLE-2 dynamic tree DEPTH,TOP_K,TOTAL_TOKENS
    profiles: str | None = None  # onnx: verify-step slot counts, e.g. "2,4,8"
    weights: str | None = None  # onnx: fp32, int8 or int4
    block_size: int | None = None  # onnx, quantized weights: values per scale

    def __post_init__(self):
        if self.backend not in ("onnx", "trtllm"):
            raise ConfigError(f"recipe build.backend {self.backend!r} is not one of onnx, trtllm")
        if self.trtllm_version is not None and self.backend != "trtllm":
            raise ConfigError("recipe build.trtllm_version needs build.backend trtllm")
        if self.preset is not None and self.choices is not None:
            raise ConfigError("recipe build: set preset or choices, not both")
        for key in ("eagle2", "profiles", "weights", "block_size"):
            if getattr(self, key) is not None and self.backend != "onnx":
                raise ConfigError(f"recipe build.{key} applies to build.backend onnx")
        if self.eagle2 is not None:
            from trtspec.speculative.tree import DynamicTree

            DynamicTree.parse(self.eagle2, "recipe build.eagle2")


@dataclass(frozen=True, kw_only=True)
class DeploySection:
    flavour: str | None = None  # default: the backend's (onnx → cpu, trtllm → trtllm)
    max_batch_size: int | None = None
    decoupled: bool = True
    instances: int = 1
    kv_cache_free_gpu_mem_fraction: float = 0.9
    method: str | None = None  # cpu flavour: the drafter every request gets (none, ngram, suffix, hybrid, own)
    datastore: str | None = None  # cpu flavour, method suffix: a `trtspec datastore build` file
    draft_budget: int | None = None  # cpu flavour: training-free drafters' tokens per step (default: the engine's K)
    threads: int | None = None  # cpu flavour: ONNX Runtime threads per instance
    spin: bool | None = None  # cpu flavour: intra-op workers spin (default: spin; false for shared machines)
    chat_template: bool = False  # render text_input through the tokenizer's chat template by default
    copy_engine: bool = False  # cpu flavour: copy the engine into the repository (self-contained)
    # llmapi flavour (TensorRT-LLM's LLM API loads base.path on the GPU host: no convert, no build)
    drafter: str | None = None  # eagle3 / mtp / ngram / draft_target (None: plain decoding)
    draft_path: str | None = None  # eagle3: the EAGLE-3 draft's folder; draft_target: the draft model's
    trtllm_version: str | None = None  # the version whose LLM-API keys model.yaml holds (default: the newest held)
    max_draft_len: int | None = None  # K (mtp: num_nextn_predict_layers)
    max_num_tokens: int | None = None
    draft_len_schedule: dict | None = None  # {batch size: draft length}, e.g. {1: 4, 4: 2, 8: 0} (`advise --schedule`)
    speculative_options: list[str] = field(default_factory=list)  # further speculative_config KEY=VALUE

    def __post_init__(self):
        if self.flavour not in (None, "cpu", "trtllm", "llmapi"):
            raise ConfigError(f"recipe deploy.flavour {self.flavour!r} is not one of cpu, trtllm, llmapi")
        if self.flavour != "llmapi":
            for key in LLMAPI_DEPLOY:
                if getattr(self, key) not in (None, []):
                    raise ConfigError(f"recipe deploy.{key} applies to deploy.flavour llmapi")
            return
        from trtspec.triton.deploy_options import DRAFTERS
        from trtspec.triton.llmapi_versions import parse_llmapi_version

        if self.drafter is not None and self.drafter not in DRAFTERS:
            raise ConfigError(f"recipe deploy.drafter {self.drafter!r} is not one of {', '.join(DRAFTERS)}")
        needs_path = self.drafter in ("eagle3", "draft_target")
        if needs_path and not self.draft_path:
            raise ConfigError(f"recipe deploy.drafter {self.drafter} needs deploy.draft_path (the draft's folder)")
        if self.draft_path and not needs_path:
            raise ConfigError("recipe deploy.draft_path applies to deploy.drafter eagle3 or draft_target")
        if not isinstance(self.speculative_options, list) or not all(
                isinstance(o, str) for o in self.speculative_options):
            raise ConfigError(f"recipe deploy.speculative_options must be a list of KEY=VALUE strings, got "
                              f"{self.speculative_options!r}")
        if self.drafter is None and (self.max_draft_len is not None or self.speculative_options
                                     or self.draft_len_schedule is not None):
            raise ConfigError("recipe deploy.max_draft_len / draft_len_schedule / speculative_options need a "
                              "deploy.drafter")
        if self.draft_len_schedule is not None and (
                not isinstance(self.draft_len_schedule, dict) or not all(
                    isinstance(k, int) and isinstance(v, int) for k, v in self.draft_len_schedule.items())):
            raise ConfigError(f"recipe deploy.draft_len_schedule must map batch sizes to draft lengths, e.g. "
                              f"{{1: 4, 4: 2, 8: 0}}, got {self.draft_len_schedule!r}")
        if self.trtllm_version is not None:
            parse_llmapi_version(str(self.trtllm_version))
        for key, default in ENGINE_DEPLOY.items():
            if getattr(self, key) != default:
                raise ConfigError(f"recipe deploy.{key} applies to the engine flavours (cpu, trtllm), not llmapi")


LLMAPI_DEPLOY = ("drafter", "draft_path", "trtllm_version", "max_draft_len", "max_num_tokens", "draft_len_schedule",
                 "speculative_options")
ENGINE_DEPLOY = {"instances": 1, "method": None, "datastore": None, "draft_budget": None, "threads": None, "spin": None,
                 "chat_template": False, "copy_engine": False}


@dataclass(frozen=True, kw_only=True)
class ServeSection:
    """The serve stage: start the real server on free loopback ports, send prompts over gRPC (streamed), check every
    greedy reply equals in-process decoding of the same engine, stop the server."""

    prompt_set: str = "mt-bench"
    limit: int = 2
    max_tokens: int = 32
    wait_s: float = 180.0  # how long the server may take to be ready

    def __post_init__(self):
        _check_prompt_sets([self.prompt_set], "serve.prompt_set")


@dataclass(frozen=True, kw_only=True)
class BenchSection:
    """The bench stage (`trtspec bench` per prompt set): each method against plain decoding on the same engine,
    interleaved, at each concurrency."""

    prompt_sets: list[str] = field(default_factory=lambda: ["mt-bench"])
    methods: list[str] = field(default_factory=list)  # default: the deploy method, else the engine's own / ngram
    limit: int = 4
    max_tokens: int = 64
    concurrency: list[int] = field(default_factory=lambda: [1])  # in-flight sequences per run (one run each)
    temperature: float = 0.0
    threads: int | None = None
    spin: bool | None = None  # None: the engine's default (spin, unless its drafter runs in a second session)
    datastore: str | None = None  # the gate's method suffix: the corpus it looks up

    def __post_init__(self):
        _check_prompt_sets(self.prompt_sets, "bench.prompt_sets")
        if not all(isinstance(m, str) for m in self.methods):
            raise ConfigError(f"recipe bench.methods must be a list of method names, got {self.methods!r}")
        if (not isinstance(self.concurrency, list) or not self.concurrency
                or not all(_is_int(c) and c is not None and c >= 1 for c in self.concurrency)):
            raise ConfigError(f"recipe bench.concurrency must be a list of positive integers, got {self.concurrency!r}")


@dataclass(frozen=True, kw_only=True)
class BaselineSection:
    """What `recipe run --gate` measures and the figures it must not fall below.

    The slice (prompt sets, limit, max tokens, method) is measured in one run, the method and plain decoding
    alternating. `tolerance` maps a figure to the relative drop allowed (0.05: 5% below the baseline fails); a figure
    without a tolerance is reported, not gated. Outputs must equal plain decoding's (T = 0) whatever the tolerances."""

    prompt_sets: list[str] = field(default_factory=lambda: ["mt-bench"])
    limit: int = 4
    max_tokens: int = 64
    method: str | None = None  # default: the bench section's first method
    tolerance: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)  # per prompt set: {tau, acceptance_rate, speedup, ...}
    # the verify curve (slot profiles, cost relative to a plain step) the figures were measured with: the gate's
    # drafters budget against it instead of a curve measured on a busy CI machine (--update-baseline writes it)
    verify_curve: dict | None = None

    def __post_init__(self):
        _check_prompt_sets(self.prompt_sets, "baseline.prompt_sets")
        if self.verify_curve is not None:
            _check_curve(self.verify_curve)
        from trtspec.recipe.gate import FIGURES

        if not isinstance(self.tolerance, dict):
            raise ConfigError(f"recipe baseline.tolerance must map figures to fractions, got {self.tolerance!r}")
        for name, value in self.tolerance.items():
            if name not in FIGURES:
                raise ConfigError(f"recipe baseline.tolerance: unknown figure {name!r}; figures: {', '.join(FIGURES)}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise ConfigError(f"recipe baseline.tolerance.{name} must be a fraction in [0, 1), got {value!r}")
        if not isinstance(self.figures, dict):
            raise ConfigError(f"recipe baseline.figures must map prompt sets to figures, got {self.figures!r}")
        for name, row in self.figures.items():
            if name not in self.prompt_sets:
                raise ConfigError(f"recipe baseline.figures.{name}: not one of baseline.prompt_sets "
                                  f"({', '.join(self.prompt_sets)})")
            if not isinstance(row, dict):
                raise ConfigError(f"recipe baseline.figures.{name} must map figures to numbers, got {row!r}")
            for figure, value in row.items():
                if figure not in FIGURES:
                    raise ConfigError(f"recipe baseline.figures.{name}: unknown figure {figure!r}; figures: "
                                      f"{', '.join(FIGURES)}")
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ConfigError(f"recipe baseline.figures.{name}.{figure} must be a number, got {value!r}")


def _check_curve(curve) -> None:
    where = "recipe baseline.verify_curve"
    if not isinstance(curve, dict) or set(curve) != {"profiles", "relative"}:
        raise ConfigError(f"{where} must have exactly profiles and relative, got {curve!r}")
    profiles, relative = curve["profiles"], curve["relative"]
    if (not isinstance(profiles, list) or not isinstance(relative, list) or len(profiles) != len(relative)
            or not profiles or profiles[0] != 1 or profiles != sorted(set(profiles))
            or not all(_is_int(p) and p for p in profiles) or not all(_is_number(c) and c > 0 for c in relative)):
        raise ConfigError(f"{where}: profiles must be increasing slot counts from 1 and relative one positive cost "
                          f"each, got {curve!r}")


def _check_prompt_sets(names, where: str) -> None:
    from trtspec.data.prompts import PROMPT_SETS

    if not isinstance(names, list) or not names:
        raise ConfigError(f"recipe {where} must be a non-empty list of prompt sets, got {names!r}")
    for name in names:
        if name not in PROMPT_SETS:
            raise ConfigError(f"recipe {where}: unknown prompt set {name!r}; known sets: {', '.join(PROMPT_SETS)}")


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    base: BaseSection
    drafter: DrafterSection = field(default_factory=DrafterSection)
    convert: ConvertSection = field(default_factory=ConvertSection)
    build: BuildSection = field(default_factory=BuildSection)
    deploy: DeploySection = field(default_factory=DeploySection)
    serve: ServeSection | None = None
    bench: BenchSection | None = None
    baseline: BaselineSection | None = None
    # `recipe run --rehearse` (not a YAML key): a trtllm recipe's GPU repository run here, its tensorrt_llm model
    # served by a CPU engine of the same checkpoint (`rehearsal()`)
    rehearse: bool = field(default=False, metadata={"key": False})

    def __post_init__(self):
        self._check_drafter()
        if self.flavour == "llmapi":
            self._check_llmapi()
        trtllm_only = (Drafter.LOOKAHEAD, Drafter.DRAFT_TARGET)
        if self.drafter.kind in trtllm_only and self.build.backend != "trtllm":
            raise ConfigError(f"recipe drafter.kind {self.drafter.kind.value} needs build.backend trtllm "
                              "(on the onnx backend: drafter.kind none and bench.methods [lookahead])")
        if self.drafter.kind is Drafter.DRAFT_TARGET and not self.build.max_draft_len:
            raise ConfigError("recipe drafter.kind draft_target needs build.max_draft_len (the most draft tokens)")
        if (self.flavour == "trtllm") != (self.build.backend == "trtllm"):
            raise ConfigError(f"recipe deploy.flavour {self.flavour} does not serve build.backend {self.build.backend}")
        if self.build.trtllm_version is not None:
            from trtspec.engine.trtllm_versions import parse_version

            parse_version(self.build.trtllm_version)
        if self.build.preset is not None:
            from trtspec.speculative.tree_presets import preset

            preset(self.build.preset)
        if self.baseline is not None and self.baseline.method is None and not self.methods:
            raise ConfigError("recipe baseline needs a method (baseline.method or bench.methods)")

    def _check_llmapi(self) -> None:
        """deploy.flavour llmapi: the LLM API loads the Hugging Face base on the GPU host, so there is no convert or
        build, no drafter section (deploy.drafter names it), and nothing this machine can serve or gate."""
        if self.base.path is None:
            raise ConfigError("recipe deploy.flavour llmapi needs base.path (the Hugging Face folder the LLM API loads)")
        for name, default in (("drafter", DrafterSection()), ("convert", ConvertSection()),
                              ("build", BuildSection())):
            if getattr(self, name) != default:
                hint = " (name it with deploy.drafter and deploy.draft_path)" if name == "drafter" else ""
                raise ConfigError(f"recipe {name}: deploy.flavour llmapi has no {name} stage{hint}; leave the "
                                  "section out")
        if self.baseline is not None:
            raise ConfigError("recipe baseline: the gate measures an engine on this machine; deploy.flavour llmapi "
                              "serves on a GPU host")

    def _check_drafter(self) -> None:
        d = self.drafter
        needs_path = d.kind in (Drafter.MEDUSA, Drafter.EAGLE, Drafter.DRAFT_TARGET, Drafter.REDRAFTER)
        if needs_path and not d.path and not (self.base.tiny is not None and d.kind is not Drafter.DRAFT_TARGET):
            raise ConfigError(f"recipe drafter.kind {d.kind.value} needs drafter.path")
        if d.path and self.base.tiny is not None:
            raise ConfigError("recipe drafter.path: a tiny base writes its own random drafter; leave the path out")
        if d.kind is not Drafter.REDRAFTER and (d.num_beams is not None or d.draft_len_per_beam is not None):
            raise ConfigError(f"recipe drafter: num_beams / draft_len_per_beam apply to redrafter, not {d.kind.value}")
        for key in ("num_beams", "draft_len_per_beam"):
            value = getattr(d, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"recipe drafter.{key} must be a positive integer, got {value!r}")
        wng = (d.window_size, d.ngram_size, d.verification_set_size)
        if d.kind is Drafter.LOOKAHEAD and None in wng:
            raise ConfigError("recipe drafter.kind lookahead needs window_size, ngram_size and verification_set_size")
        if d.kind is not Drafter.LOOKAHEAD and any(x is not None for x in wng):
            raise ConfigError(f"recipe drafter: window_size / ngram_size / verification_set_size apply to lookahead, "
                              f"not {d.kind.value}")

    @property
    def flavour(self) -> str:
        return self.deploy.flavour or ("trtllm" if self.build.backend == "trtllm" else "cpu")

    @property
    def methods(self) -> list[str]:
        """The drafters the bench stage measures against plain decoding."""
        if self.bench is not None and self.bench.methods:
            return list(self.bench.methods)
        if self.deploy.method:
            return [self.deploy.method]
        return ["ngram"] if self.drafter.kind is Drafter.NONE else []

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages this recipe has: convert, build, deploy always (deploy only for the llmapi flavour); serve and
        bench when it has those sections."""
        return tuple(s for s in STAGES if (s not in ("serve", "bench") or getattr(self, s) is not None
                                           or (s == "bench" and self.baseline is not None))
                     and (self.flavour != "llmapi" or s not in ("convert", "build")))

    def rehearsal(self) -> Recipe:
        """This trtllm recipe rehearsed on this host: the TensorRT-LLM engine planned (`build --plan-only`), a CPU
        engine of the same checkpoint and tree built beside it (a draft-target pair: one for the target, one for
        the draft), the GPU repository deployed with `--rehearse` and served here (its serve stage); the bench
        stage stays a GPU host's."""
        import dataclasses

        if self.build.backend != "trtllm":
            raise ConfigError(f"--rehearse runs a trtllm recipe's GPU repository here; {self.name} builds for "
                              f"{self.build.backend} (run it without --rehearse)")
        return dataclasses.replace(self, rehearse=True)

    def skipped(self, stage: str) -> str | None:
        """Why `recipe run` skips a stage the recipe has (None: it runs)."""
        if self.flavour == "trtllm" and stage == "bench":
            return ("the bench stage measures the TensorRT-LLM engine on its GPU host" if self.rehearse else
                    "a trtllm engine is measured on its GPU host")
        if self.flavour == "llmapi" and stage in ("serve", "bench"):
            return (f"the llmapi flavour serves in the Triton TensorRT-LLM container on a GPU host; this {stage} "
                    "stage runs trtspec's CPU engine, which this recipe does not build")
        return None

    # ---- the commands ------------------------------------------------------------------------------------

    def paths(self, workdir: str = ".") -> dict[str, str]:
        root = Path(workdir) / self.name
        return {"root": str(root), "tiny": str(root / "tiny"), "checkpoint": str(root / "checkpoint"),
                "engine": str(root / "engine"), "draft_checkpoint": str(root / "draft-checkpoint"),
                "draft_engine": str(root / "draft-engine"), "repository": str(root / "triton_repo"),
                "serve": str(root / "serve"), "bench": str(root / "bench"), "cpu_engine": str(root / "cpu-engine"),
                "cpu_draft_engine": str(root / "cpu-draft-engine")}

    def base_path(self, workdir: str = ".") -> str:
        """The HF folder convert reads: the recipe's path, the tiny base the convert stage writes, or the shell
        substitution that fetches it (what a person types)."""
        if self.base.path is not None:
            return self.base.path
        if self.base.tiny is not None:
            return str(Path(self.paths(workdir)["tiny"]) / "base")
        return f"$(trtspec models fetch {shlex.quote(self.base.fetch)})"

    def drafter_path(self, workdir: str = ".") -> str | None:
        if self.base.tiny is not None and self.drafter.kind in (Drafter.MEDUSA, Drafter.EAGLE, Drafter.REDRAFTER):
            return str(Path(self.paths(workdir)["tiny"]) / self.drafter.kind.value)
        return self.drafter.path

    def stage_commands(self, workdir: str = ".", base: str | None = None) -> dict[str, list[list[str]]]:
        """The trtspec invocations of each stage, in order (`base` replaces the base folder, e.g. once fetched)."""
        p, base = self.paths(workdir), base or self.base_path(workdir)
        if self.flavour == "llmapi":
            return {"deploy": [["trtspec", "deploy", "--flavour", "llmapi", "--hf", base, "--out", p["repository"],
                                *self._llmapi_flags()], ["trtspec", "doctor", p["repository"]]]}
        convert = [["trtspec", "convert", "--base", base, "--out", p["checkpoint"], *self._convert_flags(workdir)]]
        build = []
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            convert.append(["trtspec", "convert", "--base", self.drafter.path, "--out", p["draft_checkpoint"],
                            *self._convert_flags(workdir, drafter=False)])
            build.append(["trtspec", "build", p["draft_checkpoint"], "--out", p["draft_engine"],
                          *self._build_flags(draft=True)])
        build.append(["trtspec", "build", p["checkpoint"], "--out", p["engine"], *self._build_flags()])
        deploy = [["trtspec", "deploy", p["engine"], "--out", p["repository"], *self._deploy_flags()]]
        if self.rehearse:  # the GPU engines' plans, and the CPU engines standing in for them
            for command in build:
                command.append("--plan-only")
            build.append(["trtspec", "build", p["checkpoint"], "--out", p["cpu_engine"], *self._cpu_build_flags()])
            deploy[0] += ["--rehearse", p["cpu_engine"]]
            if self.drafter.kind is Drafter.DRAFT_TARGET:
                build.append(["trtspec", "build", p["draft_checkpoint"], "--out", p["cpu_draft_engine"],
                              *self._cpu_build_flags(draft=True)])
                deploy[0] += ["--rehearse-draft", p["cpu_draft_engine"]]
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            deploy[0] += ["--draft-engine", p["draft_engine"]]
        if self.build.backend == "trtllm":
            deploy.append(["trtspec", "doctor", p["repository"], p["engine"]])
        out = {"convert": convert, "build": build, "deploy": deploy}
        if self.serve is not None:
            s = self.serve
            out["serve"] = [["trtspec", "serve", p["repository"], "&"],
                            ["trtspec", "generate", "--url", "127.0.0.1:8001", "--wait", f"{s.wait_s:g}",
                             "--prompt-set", s.prompt_set, "--limit", str(s.limit), "--max-tokens", str(s.max_tokens),
                             "--json"]]
        if self.bench is not None:
            b = self.bench
            methods = ["--method", ",".join(self.methods)] if self.methods else []
            out["bench"] = [["trtspec", "bench", "run", p["engine"], "--prompt-set", name, *methods, "--limit", str(b.limit), "--max-tokens", str(b.max_tokens),
                             "--concurrency", ",".join(map(str, b.concurrency)), "--temperature", f"{b.temperature:g}",
                             *(["--threads", str(b.threads)] if b.threads else []),
                             *([] if b.spin is not False else ["--no-spin"]),
                             *(["--draft-budget", str(self.deploy.draft_budget)] if self.deploy.draft_budget else []),
                             "--out", str(Path(p["bench"]) / name)] for name in b.prompt_sets]
        return out

    def commands(self, workdir: str = ".") -> list[list[str]]:
        """The trtspec invocations of convert, build and deploy, in order."""
        stages = self.stage_commands(workdir)
        return [c for s in ("convert", "build", "deploy") for c in stages.get(s, [])]

    def _llmapi_flags(self) -> list[str]:
        d = self.deploy
        out = {"eagle3": ["--eagle3", d.draft_path], "mtp": ["--mtp"], "ngram": ["--ngram"],
               "draft_target": ["--draft-model", d.draft_path]}.get(d.drafter, [])
        out += ["--trtllm-version", str(d.trtllm_version)] if d.trtllm_version is not None else []
        out += ["--max-draft-len", str(d.max_draft_len)] if d.max_draft_len else []
        if d.draft_len_schedule is not None:
            out += ["--draft-len-schedule", ",".join(f"{k}:{v}" for k, v in sorted(d.draft_len_schedule.items()))]
        for option in d.speculative_options:
            out += ["--speculative-option", option]
        out += ["--max-batch-size", str(d.max_batch_size)] if d.max_batch_size else []
        out += ["--max-num-tokens", str(d.max_num_tokens)] if d.max_num_tokens else []
        out += [] if d.decoupled else ["--no-decoupled"]
        if d.kv_cache_free_gpu_mem_fraction != 0.9:
            out += ["--kv-cache-free-gpu-mem-fraction", f"{d.kv_cache_free_gpu_mem_fraction:g}"]
        return out

    def _convert_flags(self, workdir: str, drafter: bool = True) -> list[str]:
        c, d, out = self.convert, self.drafter, []
        path = self.drafter_path(workdir)
        if drafter and d.kind is Drafter.MEDUSA:
            out += ["--medusa", path] + (["--num-medusa-heads", str(d.num_heads)] if d.num_heads else [])
            out += ["--num-medusa-layers", str(d.num_medusa_layers)] if d.num_medusa_layers else []
        if drafter and d.kind is Drafter.EAGLE:
            out += ["--eagle", path, "--num-eagle-layers", str(d.num_eagle_layers),
                    "--max-non-leaves-per-layer", str(d.max_non_leaves_per_layer)]
        if drafter and d.kind is Drafter.REDRAFTER:
            out += ["--redrafter", path] + (["--redrafter-num-beams", str(d.num_beams)] if d.num_beams else [])
            out += ["--redrafter-draft-len-per-beam", str(d.draft_len_per_beam)] if d.draft_len_per_beam else []
        if drafter and d.kind in (Drafter.MEDUSA, Drafter.EAGLE) and c.max_draft_len is not None:
            out += ["--max-draft-len", str(c.max_draft_len)]
        out += ["--dtype", c.dtype] if c.dtype else []
        out += ["--tp-size", str(c.tp_size)] if c.tp_size != 1 else []
        return out + (["--pp-size", str(c.pp_size)] if c.pp_size != 1 else [])

    def _cpu_build_flags(self, draft: bool = False) -> list[str]:
        """The onnx build of the checkpoint that stands in for the TensorRT-LLM engine: the same tree and limits; a
        lookahead engine's stand-in is plain with its K (lookahead drafts per request on the CPU); a draft-target
        target's is plain with K - 1 draft slots (the first drafted token is checked against its prefill's own),
        the draft's plain."""
        b, out = self.build, ["--max-batch-size", str(self.build.max_batch_size), "--max-input-len",
                              str(self.build.max_input_len)]
        out += ["--max-seq-len", str(b.max_seq_len)] if b.max_seq_len else []
        if draft:
            return out + ["--no-spec"]
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            return out + ["--no-spec", "--max-draft-len", str(max(b.max_draft_len - 1, 1))]
        if self.drafter.kind is Drafter.LOOKAHEAD:
            from trtspec.speculative.lookahead_proposer import LookaheadConfig

            out += ["--no-spec", "--max-draft-len", str(LookaheadConfig.parse(self.drafter.lookahead).max_draft_len)]
            return out
        out += ["--max-draft-len", str(b.max_draft_len)] if b.max_draft_len else []
        out += ["--preset", b.preset] if b.preset else []
        return out + (["--choices", b.choices] if b.choices else [])

    def _build_flags(self, draft: bool = False) -> list[str]:
        b, out = self.build, ["--backend", self.build.backend]
        out += ["--trtllm-version", b.trtllm_version] if b.trtllm_version else []
        out += ["--max-batch-size", str(b.max_batch_size), "--max-input-len", str(b.max_input_len)]
        out += ["--max-seq-len", str(b.max_seq_len)] if b.max_seq_len else []
        if draft:
            return out
        if self.drafter.kind is Drafter.LOOKAHEAD:
            out += ["--lookahead", self.drafter.lookahead]
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            out += ["--draft-target"]
        if self.drafter.kind is Drafter.NONE and b.backend == "onnx":
            out += ["--no-spec"]
        out += ["--max-draft-len", str(b.max_draft_len)] if b.max_draft_len else []
        out += ["--preset", b.preset] if b.preset else []
        out += ["--choices", b.choices] if b.choices else []
        out += ["--eagle2", b.eagle2] if b.eagle2 else []
        out += ["--profiles", b.profiles] if b.profiles else []
        out += ["--weights", b.weights] if b.weights else []
        return out + (["--block-size", str(b.block_size)] if b.block_size else [])

    def _deploy_flags(self) -> list[str]:
        d = self.deploy
        out = ["--flavour", d.flavour] if d.flavour else []
        out += ["--max-batch-size", str(d.max_batch_size)] if d.max_batch_size else []
        out += [] if d.decoupled else ["--no-decoupled"]
        out += ["--instances", str(d.instances)] if d.instances != 1 else []
        out += ["--method", d.method] if d.method else []
        out += ["--datastore", d.datastore] if d.datastore else []
        out += ["--draft-budget", str(d.draft_budget)] if d.draft_budget else []
        out += ["--threads", str(d.threads)] if d.threads else []
        out += [] if d.spin is None else ["--spin" if d.spin else "--no-spin"]
        out += ["--chat-template"] if d.chat_template else []
        out += ["--copy-engine"] if d.copy_engine else []
        if self.build.backend == "trtllm" and d.kv_cache_free_gpu_mem_fraction != 0.9:
            out += ["--kv-cache-free-gpu-mem-fraction", f"{d.kv_cache_free_gpu_mem_fraction:g}"]
        return out


SECTIONS = {"base": BaseSection, "drafter": DrafterSection, "convert": ConvertSection, "build": BuildSection,
            "deploy": DeploySection, "serve": ServeSection, "bench": BenchSection, "baseline": BaselineSection}


def read_yaml(path: Path):
    try:
        import yaml
    except ImportError:
        raise ConfigError("recipes are YAML: pip install pyyaml") from None
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: unreadable recipe ({e})") from None


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe YAML file, its paths taken relative to the file's folder; ConfigError names the file
    and the first bad key."""
    data = read_yaml(path)
    try:
        return recipe_from_dict(data, folder=Path(path).parent)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


# the recipe fields that name files or folders: relative to the recipe file
PATH_FIELDS = (("base", "path"), ("drafter", "path"), ("deploy", "datastore"), ("deploy", "draft_path"),
               ("bench", "datastore"))


def resolve_path(folder: Path | str, path: str) -> str:
    """`path` as written in a recipe in `folder`: absolute (and ~) as it is, else joined to the folder, normalised
    (recipes/../models/x is models/x: what a person reads in the printed commands)."""
    path = os.path.expanduser(path)
    return path if os.path.isabs(path) else os.path.normpath(os.path.join(folder, path))


def missing_paths(file: Path) -> list[str]:
    """One line for each path the recipe `file` names (PATH_FIELDS) that does not exist, saying where it was looked
    for (`recipe check`)."""
    data, folder = read_yaml(file), Path(file).parent
    out = []
    for section, key in PATH_FIELDS:
        written = (data.get(section) or {}).get(key) if isinstance(data, dict) else None
        if not isinstance(written, str) or not written:
            continue
        resolved = resolve_path(folder, written)
        if not os.path.exists(resolved):
            where = "" if resolved == written else f" ({resolved}: paths in a recipe are relative to its file)"
            out.append(f"{section}.{key} {written} does not exist{where}")
    return out


def recipe_from_dict(data: object, folder: Path | str | None = None) -> Recipe:
    """A recipe from its YAML's data; `folder`: the recipe file's, the one its relative paths start from (None: as
    written)."""
    top = check_fields(Recipe, data, "recipe", container="a mapping")
    sections = {k: _section(k, top.get(k)) for k in SECTIONS if k in top and top.get(k) is not None}
    if "base" not in sections:
        raise ConfigError("recipe needs a base section (base.path: the Hugging Face base folder, base.fetch or "
                          "base.tiny)")
    name = str(top.get("name", "")) or _missing("name")
    if "/" in name or name in (".", ".."):
        raise ConfigError(f"recipe name {name!r} names a folder under the work dir: no slashes")
    if folder is not None:
        for section, key in PATH_FIELDS:
            value = getattr(sections.get(section), key, None)
            if isinstance(value, str) and value:
                sections[section] = dataclasses.replace(sections[section], **{key: resolve_path(folder, value)})
    return Recipe(name=name, **sections)


def _section(name: str, data: object):
    cls = SECTIONS[name]
    values = dict(check_fields(cls, data if data is not None else {}, f"recipe {name}", container="a mapping"))
    if name == "drafter" and "kind" in values:
        values["kind"] = Method.expect(values["kind"], Method.recipe_drafters(), "recipe drafter.kind")
    for f in dataclasses.fields(cls):
        if f.name in values and f.type in ("int", "int | None") and not _is_int(values[f.name]):
            raise ConfigError(f"recipe {name}.{f.name} must be an integer, got {values[f.name]!r}")
        if f.name in values and f.type in ("float",) and not _is_number(values[f.name]):
            raise ConfigError(f"recipe {name}.{f.name} must be a number, got {values[f.name]!r}")
        if f.name in values and f.type in ("bool", "bool | None") and not _is_bool(values[f.name]):
            raise ConfigError(f"recipe {name}.{f.name} must be true or false, got {values[f.name]!r}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"recipe {name}: {e}") from None


def _is_int(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _is_bool(value: object) -> bool:
    return value is None or isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _missing(key: str):
    raise ConfigError(f"recipe needs a {key}")


def command_lines(recipe: Recipe, workdir: str = ".") -> list[str]:
    return [_join(c) for c in recipe.commands(workdir)]


def _join(command: list[str]) -> str:
    """A command as a person types it (a `$(...)` substitution and a trailing `&` left unquoted)."""
    return " ".join(a if a.startswith("$(") or a == "&" else shlex.quote(a) for a in command)
