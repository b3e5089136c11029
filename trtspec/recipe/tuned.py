"""`trtspec tune --write-recipe FILE`: the winner as a complete recipe that `trtspec recipe run FILE` builds, deploys
and benches.

The recipe starts from FILE, a --recipe template or the engine itself (its manifest and its checkpoint's
`trtspec-convert.json`); the winning setting then sets the drafter, the build's K or tree, and the deploy and bench
methods, and a baseline whose setting changed loses its figures. What each kind of winner sets:
docs/recipes.md, "Recipes written by tune".
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

from trtspec.errors import ConfigError, TrtspecError
from trtspec.speculative.method import PLAIN, TRAINING_FREE, Method, names

TRAINED = names(m for m in Method.recipe_drafters() if m.trained)  # a recipe converts these drafters
PROVENANCE_FILE = "trtspec-convert.json"  # checkpoint.convert.PROVENANCE_FILE


def check_target(engine_dir: Path, path: Path, template: Path | None = None) -> None:
    """Before tuning: ConfigError unless the winner can be written (FILE or --recipe a valid recipe, else an engine
    whose checkpoint says where its base is)."""
    from trtspec.recipe.schema import read_yaml, recipe_from_dict

    origin = Path(path) if Path(path).is_file() else template
    if origin is None:
        _provenance(Path(engine_dir))
        return
    try:
        recipe_from_dict(read_yaml(origin))
    except ConfigError as e:
        raise ConfigError(f"{origin}: not a recipe to write the winner into ({e})") from None


def write_winner_recipe(report: dict, path: Path, template: Path | None = None) -> dict:
    """Write `report["winner"]` (a `tune` report) as a recipe into `path`; returns the recipe's dict. The recipe is
    validated before anything is written."""
    import yaml

    from trtspec.outdir import atomic_output_file
    from trtspec.recipe.schema import read_yaml, recipe_from_dict

    path = Path(path)
    folder = None  # where the start's relative paths are relative to (a recipe's are to its file)
    if path.is_file():
        start, origin = read_yaml(path), str(path)
    elif template is not None:
        start, origin, folder = read_yaml(template), str(template), Path(template).parent
    else:  # its paths are absolute
        start, origin = recipe_for_engine(Path(report["engine"]), report), f"engine {report['engine']}"
    try:
        recipe_from_dict(start)
    except ConfigError as e:
        raise ConfigError(f"{origin}: not a recipe to write the winner into ({e})") from None
    # a recipe written from the engine itself builds that very engine: a training-free winner redeploys it
    recipe = apply_winner(start, report, same_engine=not path.is_file() and template is None)
    if folder is not None:
        rebase_paths(recipe, folder, path.parent)
    try:
        recipe_from_dict(recipe)
    except ConfigError as e:  # a bug here, never the user's: say what was written from what
        raise ConfigError(f"--write-recipe {path}: the winner {report['winner']['name']} does not make a valid "
                          f"recipe from {origin} ({e})") from None
    text = header(report, origin) + yaml.safe_dump(recipe, sort_keys=False)
    with atomic_output_file(path) as tmp:
        tmp.write_text(text)
    return recipe


def _engine_k(report: dict) -> int | None:
    """The tuned engine's K (None: its manifest is not there to say)."""
    from trtspec.engine.manifest import read_manifest

    try:
        return read_manifest(Path(report["engine"])).profile.max_draft_len
    except (KeyError, OSError, ConfigError, TrtspecError):
        return None


def rebase_paths(recipe: dict, old: Path, new: Path) -> None:
    """A recipe dict's relative paths (schema.PATH_FIELDS), written relative to folder `old`, rewritten relative to
    folder `new`, in place: a template's recipe written elsewhere still names the same folders."""
    import os

    from trtspec.recipe.schema import PATH_FIELDS, resolve_path

    for section, key in PATH_FIELDS:
        value = (recipe.get(section) or {}).get(key)
        if isinstance(value, str) and value and not os.path.isabs(os.path.expanduser(value)):
            recipe[section][key] = os.path.relpath(os.path.abspath(resolve_path(old, value)), os.path.abspath(new))


def apply_winner(recipe: dict, report: dict, *, same_engine: bool = False) -> dict:
    """A copy of the recipe dict with the winner's drafter, K, tree, deploy method and bench methods (module
    docstring). `same_engine`: the recipe builds the tuned engine itself, so a training-free winner keeps its
    drafter and build and is deployed on it with its node budget (`deploy.draft_budget`), nothing rebuilt."""
    recipe = copy.deepcopy(recipe)
    w = report["winner"]
    method = w["method"]
    before = {k: copy.deepcopy(recipe.get(k)) for k in ("drafter", "build", "deploy")}
    build = recipe.setdefault("build", {})
    deploy = recipe.setdefault("deploy", {}) or {}
    recipe["deploy"] = deploy
    engine_k = _engine_k(report) if same_engine else None
    if method in TRAINING_FREE and engine_k is not None and engine_k >= w["budget"]:
        if w["budget"] < engine_k:
            deploy["draft_budget"] = w["budget"]
        else:
            deploy.pop("draft_budget", None)
        deploy["method"] = method
        methods = [method]
    elif method in TRAINING_FREE:
        deploy.pop("draft_budget", None)
        recipe["drafter"] = {"kind": "none"}
        convert = recipe.get("convert") or {}
        convert.pop("max_draft_len", None)  # Medusa / EAGLE only
        if "convert" in recipe:
            recipe["convert"] = convert
        for key in ("preset", "choices", "eagle2", "profiles"):
            build.pop(key, None)
        build["max_draft_len"] = w["budget"]
        deploy["method"] = method
        methods = [method]
    elif method in TRAINED and w.get("choices"):
        for key in ("preset", "eagle2"):
            build.pop(key, None)
        build["choices"] = json.dumps(w["choices"])
        build["max_draft_len"] = max(build.get("max_draft_len") or 0, len(w["choices"]))
        if build.get("profiles"):  # profiles past the new K would not build
            kept = [int(s) for s in str(build["profiles"]).split(",") if int(s) <= build["max_draft_len"] + 1]
            build["profiles"] = ",".join(map(str, kept)) if kept else None
            if not kept:
                build.pop("profiles")
        if method == "eagle":
            _eagle_depth(recipe, w["choices"])
        deploy["method"] = method
        methods = [method]
    elif method == PLAIN:
        deploy["method"] = PLAIN
        drafters = [s for s in report["settings"] if s["measured"] is not None and s["method"] != PLAIN]
        best = max(drafters, key=lambda s: s["measured"]["decode_tokens_per_s"], default=None)
        methods = [best["method"]] if best is not None else []
    else:  # the engine's own trained drafter (EAGLE-2), as it ships
        deploy["method"] = method
        methods = [method]
    bench = recipe.get("bench")
    if bench is None:
        bench = recipe["bench"] = _bench_section(report)
    if methods:
        bench["methods"] = methods
    else:
        bench.pop("methods", None)
    baseline = recipe.get("baseline")
    changed = any(before[k] != recipe.get(k) for k in before)
    if baseline is not None and (changed or baseline.get("method") not in (None, *methods)):
        if methods:
            baseline["method"] = methods[0]
        baseline.pop("figures", None)  # measured with another setting: `recipe run --gate --update-baseline`
        baseline.pop("verify_curve", None)
    return recipe


def _eagle_depth(recipe: dict, choices: list[list[int]]) -> None:
    """An EAGLE-1 tree's depth and widest level into the drafter (and the convert's K, where set, up to its nodes)."""
    from trtspec.speculative.tree import build_tree

    tree = build_tree(choices)
    drafter = recipe.setdefault("drafter", {"kind": "eagle"})
    drafter["num_eagle_layers"] = tree.depth
    drafter["max_non_leaves_per_layer"] = max(1, *tree.non_leaves_per_level())
    convert = recipe.get("convert") or {}
    if convert.get("max_draft_len") is not None:
        convert["max_draft_len"] = max(int(convert["max_draft_len"]), tree.num_nodes)


def recipe_for_engine(engine_dir: Path, report: dict) -> dict:
    """A recipe that rebuilds this engine: its manifest and its checkpoint's convert record (the base folder, the
    drafter's folder). ConfigError when the checkpoint or its record is gone."""
    manifest, record = _provenance(engine_dir)
    options = record.get("options", {})
    method, profile = manifest["method"], manifest["profile"]
    drafter: dict = {"kind": method if method in TRAINED else "none"}
    # the drafter's folder as convert resolved it (options hold it as typed, relative to where convert ran)
    if method == "medusa":
        drafter["path"] = (record.get("medusa") or {}).get("directory") or options["medusa"]
        if options.get("num_medusa_heads"):
            drafter["num_heads"] = options["num_medusa_heads"]
        if options.get("num_medusa_layers"):
            drafter["num_medusa_layers"] = options["num_medusa_layers"]
    elif method == "eagle":
        drafter.update(path=(record.get("eagle") or {}).get("directory") or options["eagle"],
                       num_eagle_layers=options.get("num_eagle_layers", 4),
                       max_non_leaves_per_layer=options.get("max_non_leaves_per_layer", 10))
    convert = {k: options[k] for k in ("dtype", "tp_size", "pp_size") if options.get(k) not in (None, 1)}
    if method in TRAINED and options.get("max_draft_len"):
        convert["max_draft_len"] = options["max_draft_len"]
    build: dict = {"backend": manifest["backend"], "max_batch_size": profile["max_batch_size"],
                   "max_input_len": profile["max_input_len"], "max_seq_len": profile["max_seq_len"],
                   "max_draft_len": profile["max_draft_len"]}
    if manifest.get("tree"):
        build["choices"] = json.dumps([list(c) for c in manifest["tree"]])
    if manifest.get("dynamic_tree"):
        t = manifest["dynamic_tree"]
        build["eagle2"] = f"{t['depth']},{t['top_k']},{t['total_tokens']}"
    from trtspec.engine.manifest import default_slot_profiles

    slots = profile.get("slot_profiles")
    if slots and tuple(slots) != default_slot_profiles(profile["max_draft_len"]):
        build["profiles"] = ",".join(map(str, slots))
    linear = (manifest.get("weights") or {}).get("linear") or {}
    if linear.get("dtype") not in (None, "fp32"):
        build["weights"] = linear["dtype"]
        if linear.get("block_size"):
            build["block_size"] = linear["block_size"]
    name = "".join(c if c.isalnum() or c in "-_." else "-" for c in f"{manifest.get('name') or engine_dir.name}-tuned").strip(".")
    recipe = {"name": name, "base": {"path": record["base"]}, "drafter": drafter}
    if convert:
        recipe["convert"] = convert
    recipe.update(build=build, deploy={}, serve={"prompt_set": _known_set(report), "limit": 2, "max_tokens": 32},
                  bench=_bench_section(report))
    return recipe


def _provenance(engine_dir: Path) -> tuple[dict, dict]:
    """(the engine's manifest, its checkpoint's convert record)."""
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    source = manifest.get("source") or ""
    record_file = Path(source) / PROVENANCE_FILE
    if not source or not record_file.is_file():
        raise ConfigError(f"--write-recipe: engine {engine_dir} does not say where its base model is (its "
                          f"checkpoint {source or '?'} has no {PROVENANCE_FILE}); name an existing recipe as the "
                          "file, or --recipe TEMPLATE")
    return manifest, json.loads(record_file.read_text())


def _known_set(report: dict) -> str:
    from trtspec.data.prompts import PROMPT_SETS

    return report["prompt_set"] if report["prompt_set"] in PROMPT_SETS else "mt-bench"


def _bench_section(report: dict) -> dict:
    """What tune measured: its prompt set (mt-bench for a file: recipes name known sets), as many prompts."""
    return {"prompt_sets": [_known_set(report)], "limit": len(report["split"].get("evaluation_ids") or []) or 4,
            "max_tokens": report["max_tokens"]}


def header(report: dict, origin: str) -> str:
    """The figures behind the choice, as YAML comments."""
    from trtspec.model.ort_session import threads_text

    w = report["winner"]
    lines = [f"trtspec tune's winner: {w['name']} (method {w['method']}"
             + (f", {w['budget']} draft nodes a step" if w["method"] in TRAINING_FREE else "")
             + (f", tree {json.dumps(w['choices'])}" if w["choices"] else "") + ")",
             f"tuned on {report['engine']}, {time.strftime('%Y-%m-%d')}; written from {origin}",
             f"calibration: {report['split']['calibration']}; evaluation: {report['split']['evaluation']}",
             f"{report['max_tokens']} tokens a prompt, T = 0, threads: {threads_text(report['threads'])}; load average "
             f"{report['load_average']['before'][0]} -> {report['load_average']['after'][0]}"]
    for s in report["settings"]:
        if s["measured"] is None:
            continue
        p, m = s["predicted"], s["measured"]
        lines.append(f"  {s['name']}: predicted τ {_num(p.get('tau'))} {_num(p.get('speedup'))}x, measured τ "
                     f"{_num(m.get('tau'))} {_num(m.get('speedup'))}x decode tokens/s over plain")
    return "".join(f"# {line}\n" for line in lines)


def _num(value) -> str:
    return "-" if value is None else f"{value:.2f}"
