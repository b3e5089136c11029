"""generate: an engine in process or a served one over gRPC."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.app import EXISTING_DIR, SPIN_HELP, cli, user_errors
from trtspec.cli.app import _sampling_flag


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
        from trtspec.speculative.lookahead_proposer import LookaheadConfig

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
    engine_facts = {"weights": generator.manifest.weights.summary()}  # --json: the weight format per component
    if not stream:  # all prompts at once, with in-flight batching
        for i, result in enumerate(generator.generate_many(prompts, options)):
            _echo_reply(result, i, as_json, engine_facts)
        return
    for i, p in enumerate(prompts):
        if i and not as_json:
            click.echo("")
        on_text = None if as_json else (lambda piece: click.echo(piece, nl=False))
        _echo_reply(generator.generate(p, options, index=i, on_text=on_text), 0, as_json, engine_facts, streamed=True)


def _echo_reply(result, index: int, as_json: bool, engine_facts: dict | None = None, *,
                streamed: bool = False) -> None:
    """One reply: a JSON line (with `engine_facts`, a local engine's), or its text (unless it was streamed) and its
    stats line on stderr, a blank line between replies."""
    if as_json:
        click.echo(json.dumps({**result.to_dict(), **(engine_facts or {})}))
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
