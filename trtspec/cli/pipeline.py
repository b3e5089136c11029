"""convert, inspect, tree, build, verify: checkpoints into engines."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click

import trtspec
from trtspec.cli.app import DIR, EXISTING_DIR, cli, user_errors


@cli.command()
@click.option("--base", required=True, type=EXISTING_DIR, help="Hugging Face base model folder.")
@click.option("--out", required=True, type=DIR, help="Output TensorRT-LLM checkpoint folder.")
@click.option("--medusa", type=EXISTING_DIR, help="Medusa heads folder (FasterDecoding, full-model or ModelOpt).")
@click.option("--num-medusa-heads", type=int, help="Heads to convert (default: all stored heads).")
@click.option("--num-medusa-layers", type=int, help="ResBlock layers per head (checked against the weights).")
@click.option("--eagle", type=EXISTING_DIR, help="EAGLE-1/2 draft folder.")
@click.option("--num-eagle-layers", type=int, default=4, show_default=True,
              help="EAGLE tree depth (EagleNet invocations), not draft transformer layers.")
@click.option("--max-non-leaves-per-layer", type=int, default=10, show_default=True,
              help="EAGLE: most non-leaf tree nodes per level.")
@click.option("--redrafter", type=EXISTING_DIR,
              help="ReDrafter drafter folder (apple/ml-recurrent-drafter's config.json + model.safetensors or "
                   "model.pt).")
@click.option("--redrafter-num-beams", type=int, default=5, show_default=True,
              help="ReDrafter: beams the drafter's beam search keeps (fixed in the engine at build).")
@click.option("--redrafter-draft-len-per-beam", type=int, default=5, show_default=True,
              help="ReDrafter: draft tokens per beam, at most the drafter's trained length.")
@click.option("--redrafter-no-greedy-search", is_flag=True,
              help="ReDrafter: the beam search samples its tokens instead of taking the most probable.")
@click.option("--trtllm-version",
              help="ReDrafter: TensorRT-LLM version whose names to write, 0.15-1.2 (ReDrafterForCausalLM before 1.0, "
                   "ReDrafterForLLaMALM / ReDrafterForQWenLM from 1.0; default: the installed one, else 1.2).")
@click.option("--max-draft-len", type=int, default=63, show_default=True,
              help="K: draft tokens per step (Medusa / EAGLE; ReDrafter's is beams x draft length per beam).")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]),
              help="Weight dtype (default: the base model's).")
@click.option("--tp-size", type=int, default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--pp-size", type=int, default=1, show_default=True, help="Pipeline-parallel stages.")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def convert(as_json: bool, redrafter_no_greedy_search: bool, trtllm_version: str | None, **flags) -> None:
    """Convert a HF base (+ Medusa heads / EAGLE draft / ReDrafter drafter) into a TensorRT-LLM checkpoint."""
    if flags["redrafter"] is not None:  # the names differ by version: the installed one's, else the newest's
        from trtspec.engine import (installed_trtllm_version as installed_version, newest_trtllm_version as newest,
                                    parse_trtllm_version as parse_version)

        installed = installed_version()
        trtllm_version = (parse_version(trtllm_version) if trtllm_version else
                          parse_version(installed) if installed else newest()).text
    flags.update(redrafter_greedy_search=not redrafter_no_greedy_search, trtllm_version=trtllm_version)
    result = trtspec.convert(trtspec.ConvertOptions(**flags), show_progress=not as_json)
    if as_json:
        click.echo(json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(result).items()}))
    else:
        click.echo(f"wrote {result.out}: {result.architecture}, {result.world_size} rank file(s), "
                   f"{result.num_tensors} tensors, {result.bytes_written / 2**20:.1f} MiB in {result.seconds:.1f} s")


def _fact_text(key: str, value) -> str:
    """One `inspect` value as text: file sizes in MiB, dicts as key: value, lists joined."""
    if key == "files":
        return ", ".join(f"{k} ({v / 2**20:.1f} MiB)" for k, v in value.items())
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, list):
        return ("; " if key == "problems" else ", ").join(map(str, value))
    return str(value)


@cli.command()
@click.argument("directory", type=EXISTING_DIR)
@click.option("--base", type=EXISTING_DIR,
              help="An EAGLE-3 draft's or a draft model's Hugging Face base: check the draft against it as `deploy "
                   "--flavour llmapi` does, one line per mismatch (exit 1 on any).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@user_errors
def inspect(directory: Path, base: Path | None, as_json: bool) -> None:
    """Summarise any HF / Medusa / EAGLE / EAGLE-3 / ReDrafter / TensorRT-LLM checkpoint folder, a built engine, or a
    Triton model repository (`trtspec deploy` output or upstream's layout)."""
    from trtspec.engine import engine_summary, is_engine_dir
    from trtspec.errors import ConfigError
    from trtspec.triton import is_model_repository, repository_summary

    if base is not None and (is_model_repository(directory) or is_engine_dir(directory)):
        raise ConfigError("--base applies to an EAGLE-3 draft or a draft model's folder, not a repository or engine")
    if is_model_repository(directory) or is_engine_dir(directory):
        repository = is_model_repository(directory)
        facts = repository_summary(directory) if repository else _engine_facts(directory, engine_summary)
        if as_json:
            click.echo(json.dumps(facts, indent=2))
            return
        if repository:
            click.echo(f"{directory}: Triton model repository · {facts.pop('flavour')} flavour")
            facts = {**{f"model {name}": line for name, line in facts.pop("models").items()}, **facts}
        else:
            planned = " (planned: no engine files yet)" if "engine_files_to_come" in facts else ""
            click.echo(f"{directory}: {facts.pop('backend')} engine · {facts.pop('method')}{planned}")
            if planned:
                facts.pop("files", None)
        for key, value in facts.items():
            click.echo(f"  {key:<26} {_fact_text(key, value)}")
        return
    summary = trtspec.inspect_checkpoint(directory)
    mismatches = _against_base(summary, directory, base) if base is not None else []
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
        if mismatches:
            raise SystemExit(1)
        return
    click.echo(f"{summary.path}: {summary.format} · {summary.architecture}")
    click.echo(f"  parameters                 {summary.num_parameters:,}")
    click.echo(f"  dtypes                     {', '.join(f'{k} ×{v}' for k, v in summary.dtypes.items())}")
    click.echo(f"  files                      {', '.join(f'{k} ({v / 2**20:.1f} MiB)' for k, v in summary.files.items())}")
    for key, value in summary.details.items():
        for i, line in enumerate(value if key in ("problems", "mismatches") else [value]):  # one line per problem
            click.echo(f"  {key if i == 0 else '':<26} {line}")
    if mismatches:
        raise SystemExit(1)


def _against_base(summary, directory: Path, base: Path) -> list[str]:
    """`inspect DRAFT --base BASE`: the llmapi flavour's drafter checks, into the summary's details (`against`, and
    `mismatches` one line each, or `eagle3_layers`)."""
    from trtspec.errors import ConfigError
    from trtspec.triton import check_llmapi_drafter, eagle3_capture

    drafter = {"eagle3": "eagle3", "hf": "draft_target"}.get(summary.format)
    if drafter is None:
        raise ConfigError(f"--base: {directory} is a {summary.format} checkpoint; --base checks an EAGLE-3 draft or a "
                          "draft model (Medusa / EAGLE-1/2 / ReDrafter drafters are checked against their base by "
                          "`trtspec convert`)")
    lines = check_llmapi_drafter(base, drafter, directory)
    kind = "EAGLE-3 draft" if drafter == "eagle3" else "draft model"
    summary.details["against"] = f"{base} ({kind}, as deploy --flavour llmapi checks it)"
    if drafter == "eagle3":
        config = json.loads((base / "config.json").read_text())
        severity, line = eagle3_capture(config, json.loads((directory / "config.json").read_text()))
        summary.details["eagle3_layers"] = line if severity == "note" else f"{severity}: {line}"
    summary.details["mismatches"] = lines or ["none"]
    return lines


def _engine_facts(directory: Path, engine_summary) -> dict:
    """engine_summary, plus for a planned TensorRT-LLM engine (`build --plan-only`) the files still to come and the
    command that writes them."""
    from trtspec.engine import expected_engine_files, is_planned, read_plan

    facts = engine_summary(directory)
    if is_planned(directory):
        plan = read_plan(directory)
        world = int(plan.get("manifest", {}).get("tp_size", 1)) * int(plan.get("manifest", {}).get("pp_size", 1))
        missing = [f for f in plan.get("engine_files") or expected_engine_files(world)
                   if not (directory / f).is_file()]
        facts["engine_files_to_come"] = missing
        if plan.get("command_line"):
            facts["trtllm_build"] = plan["command_line"]
    return facts


@cli.command()
@click.option("--choices", help="Tree choices: JSON [[0],[0,1]], C++ {{0},{0,1}} or Python [(0,),(0,1)].")
@click.option("--preset", help="Named tree, e.g. mc_sim_7b_63, eagle_25, medusa_small_8, chain_3 "
                               "(an unknown name lists them all).")
@click.option("--num-heads", type=int, help="Medusa heads: the tree depth must not exceed it.")
@click.option("--max-draft-len", type=int, help="K: the node count must not exceed it.")
@click.option("--max-non-leaves-per-layer", type=int, help="EAGLE: most non-leaf nodes allowed per level.")
@click.option("--json", "as_json", is_flag=True, help="Print the tree buffers as one JSON object.")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Draw the tree to this PNG file.")
@user_errors
def tree(choices: str | None, preset: str | None, as_json: bool, png: Path | None, **limits) -> None:
    """Validate a draft tree and show its buffers (topks, paths, packed mask)."""
    if (choices is None) == (preset is None):
        raise click.UsageError("pass exactly one of --choices or --preset")
    from trtspec.speculative import build_tree, parse_choices, tree_preset as preset_choices  # numpy only

    built = build_tree(parse_choices(choices) if choices is not None else preset_choices(preset), **limits)
    if png is not None:
        from trtspec.speculative import draw_tree

        click.echo(f"wrote the tree drawing to {draw_tree(built, png)}", err=True)
    if as_json:
        click.echo(json.dumps(built.to_json_dict()))
        return
    for key, value in built.summary().items():
        click.echo(f"  {key:<26} {', '.join(map(str, value)) if isinstance(value, list) else value}")


@cli.command()
@click.argument("source", type=EXISTING_DIR)
@click.option("--out", required=True, type=DIR, help="Output engine folder.")
@click.option("--backend", type=click.Choice(["onnx", "trtllm"]), default="onnx", show_default=True,
              help="onnx: ONNX Runtime on any CPU (the embedded default); trtllm: plan and run trtllm-build.")
@click.option("--max-draft-len", type=int, help="K: slots per generation step minus one (default: the tree size).")
@click.option("--choices", help="Draft tree as JSON / C++ {0, 1} syntax.")
@click.option("--preset", help="Named draft tree (see `trtspec tree --preset`).")
@click.option("--eagle2", "eagle2", help="EAGLE-2 dynamic tree DEPTH,TOP_K,TOTAL_TOKENS instead of a static tree.")
@click.option("--no-spec", is_flag=True, help="Build a plain engine (no drafter) from any checkpoint.")
@click.option("--profiles", help="onnx: verify-step slot counts, e.g. 2,4,8 (K + 1 is always one; default "
                                 "2,3,5,9,17,... up to K + 1): a step runs the smallest that holds its draft.")
@click.option("--weights",
              help="onnx: fp32, int8 or int4: weight-only quantization of the linear layers and lm_head "
                   "(ONNX Runtime MatMulNBits; default fp32, or what a W8A16 / W4A16 checkpoint asks for).")
@click.option("--lm-head-weights", help="onnx: fp32, int8 or int4 for the lm_head (and the tied embedding that "
                                        "gathers its rows) apart from --weights (default: as --weights).")
@click.option("--block-size", type=int, help="onnx, int8 / int4: values per scale, 32, 64 or 128 (default 32).")
@click.option("--int4-scheme", help="onnx, int4: symmetric (the default: (q - 8) x scale) or min (a float minimum per "
                                    "block too, u x scale + min, llama.cpp's Q4_1; exact on Q4_1 GGUF weights).")
@click.option("--fp32-prefill", is_flag=True,
              help="onnx, int8 / int4: the prompt (context graph) runs fp32 products over copies of the dequantized "
                   "linear layers: a faster prefill, for 4 more bytes per linear-layer weight on disk and in memory; "
                   "decode steps still read the quantized blocks.")
@click.option("--native-matmul", is_flag=True,
              help="onnx, int8 / int4 in blocks of 32: the target's quantized products (prompt and decode steps, "
                   "lm_head too) run trtspec's BlockMatMul (MatMulNBits' numbers, AVX-512 VNNI kernels over the same "
                   "blocks and bytes, no extra weights on disk): faster prompts and cheaper verify steps on CPUs with "
                   "AVX-512 VNNI; elsewhere a portable loop, slower than MatMulNBits.")
@click.option("--attention", type=click.Choice(["tree", "gqa"]),
              help="onnx: the generation graph's attention kernel: tree (trtspec's TreeAttention: a slot computes "
                   "exactly as a plain step at any place of any tree, so quantized engines verify trees; built by "
                   "scripts/setup.sh) or gqa (ONNX Runtime's GroupQueryAttention; quantized engines then draft "
                   "chains, fp32 ones differ from plain decoding by ~2e-5 in a tree slot's logits). Default: tree.")
@click.option("--quantize-heads/--no-quantize-heads", default=None,
              help="The Medusa heads / EAGLE draft in the --weights format too (default: onnx yes, else fp32; "
                   "trtllm no: kept in the base dtype, see TensorRT-LLM#2115, #1845).")
@click.option("--max-batch-size", type=int, default=8, show_default=True, help="Most sequences per step.")
@click.option("--max-input-len", type=int, default=1024, show_default=True, help="Longest prompt in tokens.")
@click.option("--max-seq-len", type=int, help="Longest prompt + output (default 2 x max input).")
@click.option("--tokenizer", type=EXISTING_DIR, help="Tokenizer folder (default: the converted HF base's).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan (the manifest) without building.")
@click.option("--plan-only", is_flag=True,
              help="trtllm: write the engine folder without its engine files (manifest, plan, tokenizer) for "
                   "`trtspec deploy` and `trtspec doctor`; trtllm-build fills it on a GPU host, then `trtspec build` "
                   "adopts it.")
@click.option("--trtllm-version",
              help="trtllm: TensorRT-LLM version to plan for, 0.15-1.2 (default: the installed one, else 1.2).")
@click.option("--lookahead", help="trtllm: lookahead decoding W,N,G on a plain checkpoint, e.g. 7,7,7.")
@click.option("--draft-target", is_flag=True, help="trtllm: a target engine verifying an external draft model's "
                                                     "tokens (needs --max-draft-len).")
@click.option("--max-num-tokens", type=int, help="trtllm: tokens per engine step (default min(8192, batch x seq), "
                                                 "at least batch x (K+1)).")
@click.option("--json", "as_json", is_flag=True,
              help="trtllm: print the plan as JSON (command, build and runtime config).")
@user_errors
def build(source: Path, backend: str, eagle2: str | None, dry_run: bool, **flags) -> None:
    """Build an engine with a padded static-K profile from a TensorRT-LLM checkpoint."""
    if backend == "trtllm":
        return _build_trtllm(source, eagle2, dry_run, **flags)
    _reject_trtllm_flags(flags)
    flags["quantize_heads"] = flags["quantize_heads"] is not False
    from trtspec.engine import BuildOptions, WeightFormat, build_onnx as build_engine, plan_build, plan_summary
    from trtspec.speculative import DynamicTree

    opts = BuildOptions(source=source, dynamic_tree=DynamicTree.parse(eagle2) if eagle2 else None, **flags)
    if dry_run:
        click.echo(plan_summary(plan_build(opts)))
        return
    manifest = build_engine(opts)
    worst = max(manifest.numerics.values(), default=0.0)
    slots = ", ".join(map(str, manifest.profile.slots)) or "none (plain)"
    w = manifest.weights
    weights = "" if w.linear == w.lm_head == WeightFormat() else f", {w.linear} weights"
    weights += "" if w.lm_head == w.linear else f" (lm_head {w.lm_head})"
    weights += "" if w.prefill is None else f", {w.prefill} prefill"
    click.echo(f"wrote {opts.out}: {manifest.method.value} engine{weights}, K={manifest.profile.max_draft_len} "
               f"(slot profiles {slots}), max ORT vs reference error {worst:.1e} of scale")


TRTLLM_ONLY = {"trtllm_version": "--trtllm-version", "lookahead": "--lookahead", "draft_target": "--draft-target",
               "max_num_tokens": "--max-num-tokens", "as_json": "--json", "plan_only": "--plan-only"}


def _reject_trtllm_flags(flags: dict) -> None:
    for key, flag in TRTLLM_ONLY.items():
        if flags.pop(key, None):
            raise click.UsageError(f"{flag} applies to --backend trtllm only")


def _build_trtllm(source: Path, eagle2: str | None, dry_run: bool, *, as_json: bool, lookahead: str | None,
                  plan_only: bool, **flags) -> None:
    if flags.pop("int4_scheme") is not None:
        raise click.UsageError("--int4-scheme applies to --backend onnx only")
    if flags.pop("attention") is not None:
        raise click.UsageError("--attention applies to --backend onnx only")
    for key in ("fp32_prefill", "native_matmul"):
        if flags.pop(key):
            raise click.UsageError(f"--{key.replace('_', '-')} applies to --backend onnx only")
    if flags.pop("lm_head_weights") is not None:
        raise click.UsageError("--lm-head-weights applies to --backend onnx only (quantize.py keeps lm_head in the "
                               "base dtype unless --quantize_lm_head)")
    flags["quantize_heads"] = bool(flags["quantize_heads"])
    if flags.pop("profiles", None) is not None:
        raise click.UsageError("--profiles applies to --backend onnx only: a TensorRT-LLM engine keeps one "
                               "max_draft_len (a GPU's verify step costs about the same at any slot count)")
    if eagle2 is not None:
        raise click.UsageError("--eagle2: the Triton tensorrt_llm model exposes no dynamic tree (EAGLE-2); build "
                               "the EAGLE engine with a static tree")
    if dry_run and plan_only:
        raise click.UsageError("pass either --dry-run (writes nothing) or --plan-only (writes the planned engine "
                               "folder), not both")
    from trtspec.engine import (Lookahead, TrtllmBuildOptions, build_trtllm as build_engine, expected_engine_files,
                                plan_trtllm_build, trtllm_available, write_plan)

    opts = TrtllmBuildOptions(source=source, lookahead=Lookahead.parse(lookahead) if lookahead else None, **flags)
    plan = plan_trtllm_build(opts)
    shown = dry_run or plan_only or not (trtllm_available() or (opts.out / "config.json").is_file())
    if shown:
        click.echo(json.dumps(plan.to_dict(), indent=2) if as_json else _plan_text(plan))
    if dry_run:
        return
    if plan_only:
        manifest = write_plan(opts, plan)
        files = ", ".join(expected_engine_files(manifest.world_size))
        click.echo(f"wrote {opts.out}: planned {manifest.method.value} TensorRT-LLM {plan.version.text} engine, "
                   f"K={manifest.profile.max_draft_len}, without its engine files ({files}): `trtspec deploy` takes "
                   f"it now; on the GPU host run the trtllm-build command above (or this `trtspec build` without "
                   f"--plan-only) into it", err=as_json)
        return
    manifest = build_engine(opts, log_notes=not shown)
    click.echo(f"wrote {opts.out}: {manifest.method.value} TensorRT-LLM {manifest.versions['tensorrt_llm']} engine, "
               f"K={manifest.profile.max_draft_len} ({manifest.profile.tokens_per_step} tokens per step)")


def _plan_text(plan) -> str:
    q = plan.quantization
    lines = [] if q is None or q.quantize_argv is None else [shlex.join(q.quantize_argv)]
    lines += [plan.command_line, ""]
    if q is not None:
        detail = f"{q.quant_algo}" + (f", group {q.group_size}" if q.group_size else "")
        lines.append(f"  {'quantization':<26} {detail}" + (f", drafter {q.drafter}" if q.drafter else ""))
    lines += [f"  {k:<26} {v}" for k, v in plan.runtime.items() if not isinstance(v, (dict, list))]
    lines.append(f"  {'engine max_seq_len':<26} {plan.build_config['max_seq_len']}")
    lines.append(f"  {'container':<26} {plan.version.container or 'see NGC release notes'}")
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


@cli.command()
@click.argument("engine", type=EXISTING_DIR)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@user_errors
def verify(engine: Path, quiet: bool) -> None:
    """Check every file of a built engine against the sizes and content hashes its manifest recorded."""
    from trtspec.engine import read_manifest, verify_files
    from trtspec.progress import progress_bar

    manifest = read_manifest(engine)  # sizes: a truncated file is one line here already
    if not manifest.checksums:
        click.echo(f"{engine}: its manifest records no checksums (a TensorRT-LLM engine's files are written on the "
                   "GPU host, after the build here); nothing to compare")
        return
    total = sum(r["size"] for r in manifest.checksums.values())
    with progress_bar(f"verify {engine.name}", total=total, enabled=not quiet) as advance:
        verify_files(engine, manifest.checksums, on_bytes=advance)
    click.echo(f"{engine}: {len(manifest.checksums)} files, {total / 2**20:.1f} MiB, every size and content hash "
               "as built")
