"""deploy, doctor, serve: Triton model repositories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.cli.app import DIR, EXISTING_DIR, SPIN_HELP, cli, user_errors


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
@click.option("--spin/--no-spin", default=None, help="CPU flavour: " + SPIN_HELP + " Served: the server's "
              "TRTSPEC_ORT_SPIN decides when neither is given.")
@click.option("--method", help="CPU flavour: the drafter every request gets: none, ngram (any engine with K >= 1), "
                               "suffix (ngram plus the server's recent outputs and --datastore), the engine's own "
                               "(default) or hybrid (its Medusa / EAGLE tree merged with suffix's candidates).")
@click.option("--datastore", type=click.Path(dir_okay=False, path_type=Path),
              help="CPU flavour: the corpus method suffix looks up (`trtspec datastore build`), for --method suffix "
                   "or requests that ask for it (referenced; copied with --copy-engine).")
@click.option("--backoff/--no-backoff", default=True, show_default=True,
              help="CPU flavour: Medusa, EAGLE and lookahead drafts shrink, or rest, while they do not pay on the "
                   "engine's verify curve; --no-backoff drafts the full tree every step (as TensorRT-LLM does).")
@click.option("--draft-engine", "draft_engine_dir", type=EXISTING_DIR,
              help="trtllm, draft-target engines: the draft model's engine (served as tensorrt_llm_draft).")
@click.option("--kv-cache-free-gpu-mem-fraction", type=float, default=0.9, show_default=True,
              help="trtllm: share of free GPU memory for the KV cache (halved per model for a draft-target pair).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@user_errors
def deploy(engine: Path, out: Path, **flags) -> None:
    """Write a Triton model repository for a built engine (everything read from its manifest)."""
    from trtspec.triton.deploy import deploy as write_repository
    from trtspec.triton.deploy_options import DeployOptions

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
    if not as_json and all(f.severity == "note" for f in findings):
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
@click.option("--openai-port", type=click.IntRange(0, 65535),
              help="Also serve an OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions) on this "
                   "port, on --address, in front of the ensemble (docs/serving.md).")
@click.option("--served-model-name", help="With --openai-port: the model name OpenAI clients send (default: ensemble).")
@user_errors
def serve(repository: Path, openai_port: int | None, served_model_name: str | None, **flags) -> None:
    """Run tritonserver on a model repository until Ctrl-C / SIGTERM; exit with tritonserver's status."""
    import signal

    from trtspec.triton.server import ServerOptions, TritonServer, exit_status

    if served_model_name is not None and openai_port is None:
        raise click.UsageError("--served-model-name names the model of the OpenAI API; pass --openai-port too")
    server = TritonServer(ServerOptions(repository=repository, **flags),
                          on_log=lambda line: click.echo(line, err=True))
    openai = None
    if openai_port is not None:  # bound before Triton starts: a port in use fails at once
        from trtspec.triton.openai_frontend import OpenAIFrontend, OpenAIServer

        frontend = OpenAIFrontend.for_repository(repository, _local(server.grpc_url),
                                                 served_model_name=served_model_name)
        openai = OpenAIServer(frontend, host=server.options.address, port=openai_port)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    try:
        with server:
            if openai is not None:
                openai.start()
                click.echo(f"OpenAI-compatible API at {openai.url} (model {frontend.name!r})", err=True)
            # on stderr, like the server's log: stdout stays free for what a caller pipes
            click.echo(f"serving {repository}: gRPC {server.grpc_url}, HTTP {server.http_url}, "
                       f"metrics {server.metrics_url} (Ctrl-C stops)", err=True)
            try:
                code = server.wait()
            except KeyboardInterrupt:
                if openai is not None:
                    openai.stop()  # no new requests; those in flight end as the server drains
                code = server.stop()
    finally:
        if openai is not None:
            openai.stop()
    status = exit_status(code)
    if status:
        reason = server.exit_reason()
        click.echo(f"Error: tritonserver exited with status {status}{': ' + reason if reason else ''}", err=True)
        sys.exit(status)
    click.echo("tritonserver exited (0)", err=True)


def _local(url: str) -> str:
    """A gRPC address to connect to: a server listening on every interface is reached on loopback."""
    host, _, port = url.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "", "[::]", "::") else url


@cli.command("openai")
@click.option("--url", required=True, help="HOST:PORT of the deployment's Triton gRPC endpoint (`trtspec serve`, or "
                                           "tensorrtllm_backend's launch_triton.sh).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (loopback by default; 0.0.0.0 for every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=9000, show_default=True)
@click.option("--tokenizer", type=EXISTING_DIR,
              help="The model's tokenizer folder, or the model repository (its preprocessing's): renders chats of "
                   "several messages, counts prompt tokens and sizes a chat without max_tokens. Without it a chat is "
                   "one user message, rendered by the deployment (trtspec's CPU flavour).")
@click.option("--model", "model", default="ensemble", show_default=True, help="The Triton model to call.")
@click.option("--served-model-name", help="The model name OpenAI clients send (default: --model).")
@click.option("--wait", "wait_s", type=float, default=0.0, help="Wait up to this many seconds for the server.")
@user_errors
def openai(url: str, host: str, port: int, tokenizer: Path | None, model: str, served_model_name: str | None,
           wait_s: float) -> None:
    """Serve an OpenAI-compatible API (/v1/models, /v1/completions, /v1/chat/completions) in front of a running
    deployment, until Ctrl-C."""
    from trtspec.triton.openai_frontend import OpenAIFrontend, OpenAIServer

    kwargs = {"model": model, "served_model_name": served_model_name}
    if tokenizer is not None and (tokenizer / "tokenizer.json").is_file():
        from trtspec.runtime.tokenizer import Tokenizer

        frontend = OpenAIFrontend(url, tokenizer=Tokenizer.from_dir(tokenizer), **kwargs)
    elif tokenizer is not None:
        frontend = OpenAIFrontend.for_repository(tokenizer, url, **kwargs)
        if frontend.tokenizer is None:
            raise click.BadParameter(f"{tokenizer} has no tokenizer.json and is not a model repository with one",
                                     param_hint="--tokenizer")
    else:
        frontend = OpenAIFrontend(url, **kwargs)
    server = OpenAIServer(frontend, host=host, port=port)
    try:
        frontend.check(wait_s=wait_s)
        click.echo(f"OpenAI-compatible API at {server.url} (model {frontend.name!r}) in front of {url} "
                   "(Ctrl-C stops)", err=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        frontend.close()
