"""deploy, doctor, serve: Triton model repositories."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from trtspec.cli.app import DIR, EXISTING_DIR, SPIN_HELP, cli, user_errors


@cli.command()
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--out", required=True, type=DIR, help="Model repository folder to write.")
@click.option("--flavour", type=click.Choice(["cpu", "trtllm", "llmapi"]),
              help="cpu: trtspec runtime on ONNX Runtime (Python backend); trtllm: tensorrtllm_backend "
                   "(default: from the engine's backend); llmapi: TensorRT-LLM's LLM API (PyTorch backend) from a "
                   "Hugging Face folder (--hf), no engine.")
@click.option("--instances", type=int, default=1, show_default=True, help="Engine model instances.")
@click.option("--max-batch-size", type=int, help="Triton max_batch_size (default: the engine profile's); llmapi: "
                                                 "the LLM's max_batch_size (default 64; Triton's stays 0).")
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
@click.option("--draft-budget", type=int, metavar="N",
              help="CPU flavour: ngram, suffix, hybrid's n-grams and lookahead draft at most N tokens a step "
                   "(default: the engine's K): a smaller budget without a rebuild (`trtspec tune` picks one).")
@click.option("--draft-engine", "draft_engine_dir", type=EXISTING_DIR,
              help="trtllm, draft-target engines: the draft model's engine (served as tensorrt_llm_draft).")
@click.option("--rehearse", type=EXISTING_DIR, metavar="CPU_ENGINE",
              help="trtllm: serve the repository's tensorrt_llm model with this CPU engine of the same checkpoint "
                   "(trtspec's engine model, the GPU model's tensors), so the GPU repository (ensemble, "
                   "preprocessing, postprocessing, BLS as the GPU host gets them) runs here with `trtspec serve`.")
@click.option("--rehearse-draft", type=EXISTING_DIR, metavar="CPU_ENGINE",
              help="trtllm, a rehearsed draft-target pair: the draft checkpoint's CPU engine, serving "
                   "tensorrt_llm_draft (--rehearse serves the target).")
@click.option("--kv-cache-free-gpu-mem-fraction", type=float, default=0.9, show_default=True,
              help="trtllm: share of free GPU memory for the KV cache (halved per model for a draft-target pair); "
                   "llmapi: kv_cache_config.free_gpu_memory_fraction.")
@click.option("--hf", "hf_dir", type=EXISTING_DIR, help="llmapi: the Hugging Face base folder.")
@click.option("--trtllm-version", help="llmapi: the TensorRT-LLM version whose LLM-API keys to write (1.3 or 1.4; "
                                       "default 1.4).")
@click.option("--eagle3", "eagle3_dir", type=EXISTING_DIR, help="llmapi: an EAGLE-3 draft folder (decoding_type Eagle3).")
@click.option("--mtp", is_flag=True, help="llmapi: the base's own multi-token-prediction layers (decoding_type MTP).")
@click.option("--ngram", is_flag=True, help="llmapi: prompt-lookup n-gram drafting (decoding_type NGram).")
@click.option("--draft-model", "draft_model_dir", type=EXISTING_DIR,
              help="llmapi: a smaller model of the same tokenizer drafts (decoding_type DraftTarget).")
@click.option("--max-draft-len", type=int, help="llmapi: K, draft tokens per step (default 3; --mtp: "
                                                "num_nextn_predict_layers, default the base's).")
@click.option("--max-total-draft-tokens", type=int, help="llmapi, --eagle3 / --mtp: most draft-tree nodes.")
@click.option("--dynamic-tree", "dynamic_tree_top_k", type=int, metavar="TOP_K",
              help="llmapi, --eagle3 / --mtp: a dynamic draft tree expanding TOP_K tokens per node.")
@click.option("--max-concurrency", type=int, help="llmapi: no speculation above this many requests in flight.")
@click.option("--draft-len-schedule", metavar="BATCH:LEN,...",
              help="llmapi: draft length by batch size, e.g. 1:4,4:2,8:0 (a batch of n drafts the length of the "
                   "largest BATCH <= n; 1 must give --max-draft-len); `trtspec advise --schedule` measures one.")
@click.option("--max-matching-ngram-size", type=int, help="llmapi, --ngram: longest n-gram matched (default 3).")
@click.option("--speculative-option", "speculative_options", multiple=True, metavar="KEY=VALUE",
              help="llmapi: another speculative_config field (VALUE as YAML); a field the version lacks is refused.")
@click.option("--max-num-tokens", type=int, default=8192, show_default=True,
              help="llmapi: the LLM's max_num_tokens (tokens per engine step).")
@click.option("--kv-cache-reuse/--no-kv-cache-reuse", default=True, show_default=True,
              help="llmapi: kv_cache_config.enable_block_reuse.")
@click.option("--model-path", help="llmapi: `model` as the GPU host sees it (default: --hf, absolute).")
@click.option("--draft-path", help="llmapi: `speculative_model` as the GPU host sees it (default: the draft folder, "
                                   "absolute).")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@user_errors
def deploy(engine: Path | None, out: Path, **flags) -> None:
    """Write a Triton model repository for a built engine, or for a Hugging Face folder (--flavour llmapi).

    An engine's repository reads everything from its manifest; --flavour llmapi writes TensorRT-LLM's LLM-API
    (PyTorch backend) model.yaml for --hf DIR and its drafter."""
    from trtspec.errors import ConfigError
    from trtspec.triton import DeployOptions, deploy_repository as write_repository

    llmapi = {k: flags.pop(k) for k in LLMAPI_FLAGS}
    if flags["flavour"] == "llmapi":
        repo = _deploy_llmapi(engine, out, flags, llmapi)
        click.echo(f"wrote {repo}: serve its tensorrt_llm model in the Triton TensorRT-LLM container "
                   f"(tritonserver --model-repository={repo.resolve()})")
        return
    given = [LLMAPI_FLAGS[k] for k, v in llmapi.items()
             if type(v) is not type(LLMAPI_DEFAULTS.get(k)) or v != LLMAPI_DEFAULTS.get(k)]
    if given:
        raise ConfigError(f"{given[0]} applies to --flavour llmapi only")
    if engine is None:
        raise ConfigError("missing argument ENGINE (or deploy a Hugging Face folder with --flavour llmapi --hf DIR)")
    repo = write_repository(DeployOptions(engine_dir=engine, out=out, **flags))
    if flags["rehearse"] is not None:
        click.echo(f"wrote {repo}: the GPU repository, its tensorrt_llm model served by {flags['rehearse']}; "
                   f"rehearse it with `trtspec serve {repo}`")
        return
    if (repo / "launch_triton.sh").is_file():
        click.echo(f"wrote {repo}: serve it with {repo / 'launch_triton.sh'} in the TensorRT-LLM Triton container")
        return
    click.echo(f"wrote {repo}: serve it with `trtspec serve {repo}`")


LLMAPI_FLAGS = {"hf_dir": "--hf", "trtllm_version": "--trtllm-version", "eagle3_dir": "--eagle3", "mtp": "--mtp",
                "ngram": "--ngram", "draft_model_dir": "--draft-model", "max_draft_len": "--max-draft-len",
                "max_total_draft_tokens": "--max-total-draft-tokens", "dynamic_tree_top_k": "--dynamic-tree",
                "max_concurrency": "--max-concurrency", "draft_len_schedule": "--draft-len-schedule",
                "max_matching_ngram_size": "--max-matching-ngram-size",
                "speculative_options": "--speculative-option", "max_num_tokens": "--max-num-tokens",
                "kv_cache_reuse": "--kv-cache-reuse", "model_path": "--model-path", "draft_path": "--draft-path"}
LLMAPI_DEFAULTS = {"mtp": False, "ngram": False, "speculative_options": (), "max_num_tokens": 8192,
                   "kv_cache_reuse": True}  # the others: None
ENGINE_ONLY = {"instances": ("--instances", 1), "chat_template": ("--chat-template", False),
               "copy_engine": ("--copy-engine", False), "threads": ("--threads", None), "spin": ("--spin", None),
               "method": ("--method", None), "datastore": ("--datastore", None), "backoff": ("--no-backoff", True),
               "draft_engine_dir": ("--draft-engine", None), "rehearse": ("--rehearse", None),
               "rehearse_draft": ("--rehearse-draft", None),
               "draft_budget": ("--draft-budget", None)}


def _deploy_llmapi(engine: Path | None, out: Path, flags: dict, llmapi: dict) -> Path:
    from trtspec.errors import ConfigError
    from trtspec.triton import LlmapiOptions, deploy_llmapi

    if engine is not None:
        raise ConfigError("--flavour llmapi deploys a Hugging Face folder (--hf DIR), not an engine: drop ENGINE")
    if llmapi["hf_dir"] is None:
        raise ConfigError("--flavour llmapi needs --hf DIR, the Hugging Face base folder")
    for key, (flag, default) in ENGINE_ONLY.items():
        if flags[key] != default:
            raise ConfigError(f"{flag} applies to the engine flavours, not --flavour llmapi")
    drafters = [name for name, on in (("eagle3", llmapi["eagle3_dir"] is not None), ("mtp", llmapi["mtp"]),
                                      ("ngram", llmapi["ngram"]),
                                      ("draft_target", llmapi["draft_model_dir"] is not None)) if on]
    if len(drafters) > 1:
        raise ConfigError("pass at most one of --eagle3, --mtp, --ngram, --draft-model")
    eagle3_dir, draft_model_dir = llmapi.pop("eagle3_dir"), llmapi.pop("draft_model_dir")
    draft_dir = eagle3_dir or draft_model_dir
    del llmapi["mtp"], llmapi["ngram"]
    if llmapi["draft_len_schedule"] is not None:
        from trtspec.triton import parse_draft_len_schedule

        llmapi["draft_len_schedule"] = parse_draft_len_schedule(llmapi["draft_len_schedule"])
    batch = flags["max_batch_size"]
    return deploy_llmapi(LlmapiOptions(
        out=out, drafter=drafters[0] if drafters else None, draft_dir=draft_dir, decoupled=flags["decoupled"],
        kv_cache_free_gpu_mem_fraction=flags["kv_cache_free_gpu_mem_fraction"], force=flags["force"],
        speculative_options=tuple(llmapi.pop("speculative_options")),
        **({"max_batch_size": batch} if batch is not None else {}), **llmapi))


@cli.command()
@click.argument("repository", type=EXISTING_DIR)
@click.argument("engine", type=EXISTING_DIR, required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the findings, and what was checked, as JSON.")
@user_errors
def doctor(repository: Path, engine: Path | None, as_json: bool) -> None:
    """Check a TensorRT-LLM or CPU Triton repository and its engine.

    TensorRT-LLM: tensorrtllm_backend's configs against the engine's config.json. CPU: the engine its model loads
    (manifest, file sizes and hashes), the compiled ops it runs, its method, datastore and threads. Prints every
    problem found and what was checked; exit 1 on any error."""
    from trtspec.triton import check_repository as check, doctor_report as report

    checked = []
    findings = check(repository, engine, checked)
    if as_json:
        click.echo(json.dumps(report(findings, checked), indent=2))
    for line in [] if as_json else [*findings, *checked]:
        click.echo(str(line))
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
    import contextlib
    import signal

    from trtspec.triton import ServerOptions, TritonServer, exit_status

    if served_model_name is not None and openai_port is None:
        raise click.UsageError("--served-model-name names the model of the OpenAI API; pass --openai-port too")
    server = TritonServer(ServerOptions(repository=repository, **flags),
                          on_log=lambda line: click.echo(line, err=True))
    openai = None
    if openai_port is not None:  # bound before Triton starts: a port in use fails at once
        from trtspec.triton import OpenAIServer

        openai = OpenAIServer.beside(server, repository, port=openai_port, served_model_name=served_model_name)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops it like Ctrl-C
    with server, openai or contextlib.nullcontext():  # the API starts once Triton is ready and stops first
        if openai is not None:
            click.echo(f"OpenAI-compatible API at {openai.url} (model {openai.frontend.name!r})", err=True)
        # on stderr, like the server's log: stdout stays free for what a caller pipes
        click.echo(f"serving {repository}: gRPC {server.grpc_url}, HTTP {server.http_url}, "
                   f"metrics {server.metrics_url} (Ctrl-C stops)", err=True)
        try:
            code = server.wait()
        except KeyboardInterrupt:
            if openai is not None:
                openai.stop()  # no new requests; those in flight end as the server drains
            code = server.stop()
    status = exit_status(code)
    if status:
        reason = server.exit_reason()
        click.echo(f"Error: tritonserver exited with status {status}{': ' + reason if reason else ''}", err=True)
        sys.exit(status)
    click.echo("tritonserver exited (0)", err=True)


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
    from trtspec.triton import OpenAIFrontend, OpenAIServer

    frontend = OpenAIFrontend.with_tokenizer(url, tokenizer, model=model, served_model_name=served_model_name)
    server = OpenAIServer(frontend, host=host, port=port)

    def ready() -> None:  # on stderr: stdout stays free for what a caller pipes
        click.echo(f"OpenAI-compatible API at {server.url} (model {frontend.name!r}) in front of {url} "
                   "(Ctrl-C stops)", err=True)

    try:
        server.serve_forever(wait_s=wait_s, on_ready=ready)
    except KeyboardInterrupt:
        pass
