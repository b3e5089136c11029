"""generate: an engine in process or a served one over gRPC."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click

from trtspec.cli.app import EXISTING_DIR, SPIN_HELP, cli, user_errors
from trtspec.cli.app import _sampling_flag


@cli.command()
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--url", help="HOST:PORT of a Triton gRPC endpoint (`trtspec serve`) instead of a local ENGINE "
                            "(a bare HOST: serve's default gRPC port, 8001).")
@click.option("--prompt", help="One prompt (goes through the chat template).")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="JSONL file: one {\"prompt\": ...}, {\"messages\": [...]} or {\"input_ids\": [...]} per line "
                   "(optional \"id\", \"category\").")
@click.option("--prompt-set", help="A real prompt set: mt-bench, humaneval, sharegpt, champ, sharegpt-grounded, "
                                   "code-edit (first turn of each; `trtspec bench --sets mt-bench-2turn` runs its "
                                   "second).")
@click.option("--limit", type=int, help="With --prompt-set: the first N prompts.")
@click.option("--max-tokens", type=int, default=128, show_default=True, help="Tokens to generate per prompt.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 = greedy.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--top-k", type=int, default=0, show_default=True, help="0 = off.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--top-p", type=float, default=1.0, show_default=True, help="1 = off.",
              callback=lambda ctx, param, value: _sampling_flag(param, value))
@click.option("--seed", type=int, help="Sampling seed.")
@click.option("--repetition-penalty", type=float, default=1.0, show_default=True,
              help="> 0; 1 = off: the logit of every token in the prompt or output so far divided by it (times it "
                   "when negative), TensorRT-LLM's semantics.")
@click.option("--presence-penalty", type=float, default=0.0, show_default=True,
              help="Subtracted from the logit of every token in the prompt or output so far; 0 = off.")
@click.option("--frequency-penalty", type=float, default=0.0, show_default=True,
              help="Subtracted from a token's logit once per occurrence in the prompt or output so far; 0 = off.")
@click.option("--stop", "stops", multiple=True, metavar="TEXT",
              help="Stop when the output ends with this text's tokens (repeatable).")
@click.option("--logprobs", "return_log_probs", is_flag=True,
              help="Report log p(token) of every output token (--json: log_probs; else their sum on stderr).")
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
@click.option("--backoff/--no-backoff", default=True, show_default=True,
              help="Medusa, EAGLE and lookahead drafts shrink, or rest, while they do not pay on the engine's "
                   "verify curve; --no-backoff drafts the full tree every step (as TensorRT-LLM does).")
@click.option("--wait", "wait_s", type=float, default=0.0, help="--url: wait up to this many seconds for the server.")
@click.option("--stream/--no-stream", default=None,
              help="Print text as it is generated (default: on with --url, off locally, where prompts are batched).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per prompt.")
@click.option("--threads", type=int, help="ONNX Runtime intra-op threads (default: all cores).")
@click.option("--spin/--no-spin", default=None, help=SPIN_HELP)
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
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
        from trtspec.speculative import LookaheadConfig

        flags["lookahead"] = LookaheadConfig.parse(lookahead_text)
    if datastore is not None and flags.get("method") not in ("suffix", "hybrid"):
        raise click.UsageError("--datastore is the corpus of --method suffix (or hybrid); pass the method too")
    if datastore is not None and url is not None:
        raise click.UsageError("--datastore applies to a local ENGINE (a server's is set at deploy: "
                               "`trtspec deploy --method suffix --datastore FILE`)")
    if not flags["backoff"] and url is not None:
        raise click.UsageError("--no-backoff applies to a local ENGINE (a server's drafters always back off)")
    if sum(x is not None for x in (prompt, prompts_file, prompt_set)) != 1:
        raise click.UsageError("pass exactly one of --prompt, --prompts or --prompt-set")
    if (engine is None) == (url is None):
        raise click.UsageError("pass an ENGINE directory or --url HOST:PORT (not both)")
    from trtspec.data import generation_inputs
    from trtspec.speculative import GenerationConfig, Penalties, SamplingParams

    prompts = generation_inputs(prompt=prompt, prompts_file=prompts_file, prompt_set=prompt_set, limit=limit)
    sampling = SamplingParams(**{name: flags.pop(name) for name in ("temperature", "top_k", "top_p", "seed")})
    penalties = Penalties(*(flags.pop(f"{name}_penalty") for name in ("repetition", "presence", "frequency")))
    stops = [s for s in flags.pop("stops") if s]
    config = GenerationConfig(sampling=sampling, penalties=penalties, **flags)
    on_text = None if as_json else (lambda index, piece: click.echo(piece, nl=False))
    if url is not None:
        from trtspec.triton import generate_remote

        streamed = stream is not False and concurrency == 1  # concurrent replies print when they are complete
        replies = generate_remote(url, prompts, config, model=model_name, stream=stream is not False,
                                  concurrency=concurrency, wait_s=wait_s, on_text=on_text if streamed else None,
                                  stop_words=stops)
        engine_facts = {}
    else:
        from trtspec.runtime import LocalGenerator

        streamed = bool(stream)  # else all prompts at once, with in-flight batching
        generator = LocalGenerator(engine, threads=threads, spin=spin, datastore=datastore,
                                   drafter=_runs_drafter(config))
        engine_facts = {"weights": generator.manifest.weights.summary()}  # --json: the weight format per component
        if stops:  # as the server's preprocessing turns them into ids
            config = dataclasses.replace(config, stop_words=generator.stop_words(stops))
        replies = generator.replies(prompts, config, stream=streamed, on_text=on_text)
    for i, reply in enumerate(replies):
        _echo_reply(reply, as_json, engine_facts, streamed=streamed)
        if not as_json and i < len(prompts) - 1:
            click.echo("")  # a blank line between replies


def _runs_drafter(config) -> bool:
    """Whether the run may use the engine's own drafter graphs (its own method, or hybrid): not for --no-spec or a
    method that drafts without them."""
    from trtspec.speculative import Method

    if config.no_spec:
        return False
    method = Method.parse(config.method) if config.method else None
    return method is None or method.trained or method is Method.HYBRID


def _echo_reply(reply, as_json: bool, engine_facts: dict, *, streamed: bool) -> None:
    """One reply: a JSON line (with `engine_facts`, a local engine's), or its text (unless it was streamed) and its
    stats line on stderr."""
    if as_json:
        click.echo(json.dumps({**reply.to_dict(), **engine_facts}))
        return
    click.echo("" if streamed else _text(reply))
    click.echo(_stats_line(reply.to_dict()), err=True)


def _stats_line(record: dict) -> str:
    s = record["stats"]
    # a reply that came in one response (--url --no-stream) has no first-token time: its latency is the whole reply's
    timing = f"TTFT {s['ttft_ms']:.0f} ms" if s["ttft_ms"] is not None else \
        f"whole-reply latency {s['latency_ms']:.0f} ms"
    log_probs = record.get("log_probs")
    log_p = "" if log_probs is None else f", log p {sum(log_probs):.2f}"
    return (f"[{len(record['output_ids'])} tokens in {s['steps']} steps: acceptance length {s['acceptance_length']:.2f}, "
            f"acceptance rate {s['acceptance_rate']:.0%}, {s['tokens_per_second']:.1f} tok/s, {timing}{log_p}, "
            f"finish {record['finish_reason'] or '-'}]")


def _text(result) -> str:
    return result.text if result.text is not None else " ".join(map(str, result.output_ids))
