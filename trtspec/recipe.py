"""Recipes: one YAML file names the base, the drafter and the convert / build / deploy settings of a pipeline.

A recipe is validated as a whole (unknown keys rejected with the valid ones listed, method-specific fields
required, backend and flavour consistent) and turns into the exact `trtspec` commands a person runs;
`trtspec recipe check FILE` prints them.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.errors import ConfigError, check_fields


class Drafter(enum.Enum):
    NONE = "none"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"
    DRAFT_TARGET = "draft_target"


@dataclass(frozen=True, kw_only=True)
class BaseSection:
    path: str  # the Hugging Face base model folder convert reads
    model: str | None = None  # where it comes from (a hub id, for people; nothing downloads it)


@dataclass(frozen=True, kw_only=True)
class DrafterSection:
    kind: Drafter = Drafter.NONE
    path: str | None = None  # Medusa heads / EAGLE draft folder; draft_target: the draft model's HF folder
    num_heads: int | None = None  # Medusa heads to convert (default: all stored)
    num_eagle_layers: int = 4  # EAGLE tree depth
    max_non_leaves_per_layer: int = 10
    window_size: int | None = None  # lookahead (W, N, G)
    ngram_size: int | None = None
    verification_set_size: int | None = None

    def __post_init__(self):
        needs_path = self.kind in (Drafter.MEDUSA, Drafter.EAGLE, Drafter.DRAFT_TARGET)
        if needs_path and not self.path:
            raise ConfigError(f"recipe drafter.kind {self.kind.value} needs drafter.path")
        wng = (self.window_size, self.ngram_size, self.verification_set_size)
        if self.kind is Drafter.LOOKAHEAD and None in wng:
            raise ConfigError("recipe drafter.kind lookahead needs window_size, ngram_size and verification_set_size")
        if self.kind is not Drafter.LOOKAHEAD and any(x is not None for x in wng):
            raise ConfigError(f"recipe drafter: window_size / ngram_size / verification_set_size apply to lookahead, "
                              f"not {self.kind.value}")

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
    max_draft_len: int | None = None
    preset: str | None = None
    choices: str | None = None

    def __post_init__(self):
        if self.backend not in ("onnx", "trtllm"):
            raise ConfigError(f"recipe build.backend {self.backend!r} is not one of onnx, trtllm")
        if self.trtllm_version is not None and self.backend != "trtllm":
            raise ConfigError("recipe build.trtllm_version needs build.backend trtllm")
        if self.preset is not None and self.choices is not None:
            raise ConfigError("recipe build: set preset or choices, not both")


@dataclass(frozen=True, kw_only=True)
class DeploySection:
    flavour: str | None = None  # default: the backend's (onnx → cpu, trtllm → trtllm)
    max_batch_size: int | None = None
    decoupled: bool = True
    instances: int = 1
    kv_cache_free_gpu_mem_fraction: float = 0.9


@dataclass(frozen=True, kw_only=True)
class Recipe:
    name: str
    base: BaseSection
    drafter: DrafterSection = field(default_factory=DrafterSection)
    convert: ConvertSection = field(default_factory=ConvertSection)
    build: BuildSection = field(default_factory=BuildSection)
    deploy: DeploySection = field(default_factory=DeploySection)

    def __post_init__(self):
        trtllm_only = (Drafter.LOOKAHEAD, Drafter.DRAFT_TARGET)
        if self.drafter.kind in trtllm_only and self.build.backend != "trtllm":
            raise ConfigError(f"recipe drafter.kind {self.drafter.kind.value} needs build.backend trtllm")
        if self.drafter.kind is Drafter.DRAFT_TARGET and not self.build.max_draft_len:
            raise ConfigError("recipe drafter.kind draft_target needs build.max_draft_len (the most draft tokens)")
        flavour = self.deploy.flavour or ("trtllm" if self.build.backend == "trtllm" else "cpu")
        if (flavour == "trtllm") != (self.build.backend == "trtllm"):
            raise ConfigError(f"recipe deploy.flavour {flavour} does not serve build.backend {self.build.backend}")
        if self.build.trtllm_version is not None:
            from trtspec.engine.trtllm_versions import parse_version

            parse_version(self.build.trtllm_version)
        if self.build.preset is not None:
            from trtspec.speculative.tree_presets import preset

            preset(self.build.preset)

    # ---- the commands ------------------------------------------------------------------------------------

    def paths(self, workdir: str = ".") -> dict[str, str]:
        root = Path(workdir) / self.name
        return {"checkpoint": str(root / "checkpoint"), "engine": str(root / "engine"),
                "draft_checkpoint": str(root / "draft-checkpoint"), "draft_engine": str(root / "draft-engine"),
                "repository": str(root / "triton_repo")}

    def commands(self, workdir: str = ".") -> list[list[str]]:
        """The trtspec invocations of the whole pipeline, in order."""
        p, cmds = self.paths(workdir), []
        cmds.append(["trtspec", "convert", "--base", self.base.path, "--out", p["checkpoint"], *self._convert_flags()])
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            cmds.append(["trtspec", "convert", "--base", self.drafter.path, "--out", p["draft_checkpoint"],
                         *self._convert_flags(drafter=False)])
            cmds.append(["trtspec", "build", p["draft_checkpoint"], "--out", p["draft_engine"],
                         *self._build_flags(draft=True)])
        cmds.append(["trtspec", "build", p["checkpoint"], "--out", p["engine"], *self._build_flags()])
        deploy = ["trtspec", "deploy", p["engine"], "--out", p["repository"], *self._deploy_flags()]
        if self.drafter.kind is Drafter.DRAFT_TARGET:
            deploy += ["--draft-engine", p["draft_engine"]]
        cmds.append(deploy)
        if self.build.backend == "trtllm":
            cmds.append(["trtspec", "doctor", p["repository"], p["engine"]])
        return cmds

    def _convert_flags(self, drafter: bool = True) -> list[str]:
        c, d, out = self.convert, self.drafter, []
        if drafter and d.kind is Drafter.MEDUSA:
            out += ["--medusa", d.path] + (["--num-medusa-heads", str(d.num_heads)] if d.num_heads else [])
        if drafter and d.kind is Drafter.EAGLE:
            out += ["--eagle", d.path, "--num-eagle-layers", str(d.num_eagle_layers),
                    "--max-non-leaves-per-layer", str(d.max_non_leaves_per_layer)]
        if drafter and d.kind in (Drafter.MEDUSA, Drafter.EAGLE) and c.max_draft_len is not None:
            out += ["--max-draft-len", str(c.max_draft_len)]
        out += ["--dtype", c.dtype] if c.dtype else []
        out += ["--tp-size", str(c.tp_size)] if c.tp_size != 1 else []
        return out + (["--pp-size", str(c.pp_size)] if c.pp_size != 1 else [])

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
        out += ["--max-draft-len", str(b.max_draft_len)] if b.max_draft_len else []
        out += ["--preset", b.preset] if b.preset else []
        return out + (["--choices", b.choices] if b.choices else [])

    def _deploy_flags(self) -> list[str]:
        d = self.deploy
        out = ["--flavour", d.flavour] if d.flavour else []
        out += ["--max-batch-size", str(d.max_batch_size)] if d.max_batch_size else []
        out += [] if d.decoupled else ["--no-decoupled"]
        out += ["--instances", str(d.instances)] if d.instances != 1 else []
        if self.build.backend == "trtllm" and d.kv_cache_free_gpu_mem_fraction != 0.9:
            out += ["--kv-cache-free-gpu-mem-fraction", f"{d.kv_cache_free_gpu_mem_fraction:g}"]
        return out


SECTIONS = {"base": BaseSection, "drafter": DrafterSection, "convert": ConvertSection, "build": BuildSection,
            "deploy": DeploySection}


def load_recipe(path: Path) -> Recipe:
    """Read and validate a recipe YAML file; ConfigError names the file and the first bad key."""
    try:
        import yaml
    except ImportError:
        raise ConfigError("recipes are YAML: pip install pyyaml") from None
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: unreadable recipe ({e})") from None
    try:
        return recipe_from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def recipe_from_dict(data: object) -> Recipe:
    top = check_fields(Recipe, data, "recipe", container="a mapping")
    sections = {k: _section(k, top.get(k)) for k in SECTIONS if k in top}
    if "base" not in sections:
        raise ConfigError("recipe needs a base section (base.path: the Hugging Face base folder)")
    return Recipe(name=str(top.get("name", "")) or _missing("name"), **sections)


def _section(name: str, data: object):
    cls = SECTIONS[name]
    values = dict(check_fields(cls, data, f"recipe {name}", container="a mapping"))
    if name == "drafter" and "kind" in values:
        try:
            values["kind"] = Drafter(values["kind"])
        except ValueError:
            raise ConfigError(f"recipe drafter.kind {values['kind']!r} is not one of "
                              f"{', '.join(d.value for d in Drafter)}") from None
    for f in dataclasses.fields(cls):
        if f.name in values and f.type in ("int", "int | None") and not _is_int(values[f.name]):
            raise ConfigError(f"recipe {name}.{f.name} must be an integer, got {values[f.name]!r}")
    try:
        return cls(**values)
    except TypeError as e:
        raise ConfigError(f"recipe {name}: {e}") from None


def _is_int(value: object) -> bool:
    return value is None or (isinstance(value, int) and not isinstance(value, bool))


def _missing(key: str):
    raise ConfigError(f"recipe needs a {key}")


def command_lines(recipe: Recipe, workdir: str = ".") -> list[str]:
    return [shlex.join(c) for c in recipe.commands(workdir)]
