"""bench formats: weight formats and the quantized peers side by side in one run (trtspec.bench.formats)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.app import DIR, EXISTING_DIR, user_errors
from trtspec.cli.bench import _csv, _pair, bench


@bench.command("formats")
@click.argument("engines", nargs=-1, required=True, type=EXISTING_DIR)
@click.option("--peers", callback=_csv(str),
              default="onnxruntime-genai,llama.cpp,llama.cpp-lookup,openvino,openvino-lookup", show_default=True,
              help="onnxruntime-genai (int4, its own builder), llama.cpp (Q4 GGUF, llama-cpp-python: "
                   "scripts/setup-peers.sh builds it), llama.cpp-lookup (the same with its prompt-lookup "
                   "speculation), openvino (OpenVINO GenAI at the engines' int8 / int4 formats, exported by "
                   "optimum-intel: PEERS=openvino bash scripts/setup-peers.sh installs both) and openvino-lookup (the "
                   "same with its prompt lookup): decoding on the same ids (needs --hf); pass '' for none.")
@click.option("--hf", type=EXISTING_DIR, help="The engines' Hugging Face model folder (for --peers).")
@click.option("--gguf", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="llama.cpp's model (default: the GGUF the --hf folder was converted from).")
@click.option("--llama-lookup", callback=_pair, default="2,2", show_default=True, metavar="N,K",
              help="llama.cpp-lookup: LlamaPromptLookupDecoding's max_ngram_size, num_pred_tokens.")
@click.option("--openvino-lookup", callback=_pair, default="3,5", show_default=True, metavar="N,K",
              help="openvino-lookup: GenerationConfig's max_ngram_size, num_assistant_tokens.")
@click.option("--sets", callback=_csv(str), default="sharegpt-grounded,code-edit", show_default=True,
              help="Prompt sets (their measure splits; mt-bench-2turn: the second turn after the first ENGINE's "
                   "greedy first answer); the int4 targets read the grounded ones, OpenVINO's every set.")
@click.option("--methods", callback=_csv(str), default="ngram", show_default=True,
              help="Drafters measured on every engine (its own drafter is added when it has one).")
@click.option("--limit", type=click.IntRange(min=1), default=4, show_default=True, help="Prompts per set.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True,
              help="New tokens per prompt.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True,
              help="Intra-op threads of every system.")
@click.option("--rounds", type=click.IntRange(min=1), default=2, show_default=True,
              help="Rounds over all systems (the engines' verify curves, then decoding), the order reversed every "
                   "other round.")
@click.option("--past", type=click.IntRange(min=1), default=256, show_default=True,
              help="Prefilled length of the verify curve.")
@click.option("--repeats", type=click.IntRange(min=1), default=10, show_default=True,
              help="Timed steps per slot count of the verify curve (over all rounds).")
@click.option("--work", type=DIR, help="The peers' builds and the children's log (default: the cache's bench/formats).")
@click.option("--out", type=DIR, help="Write summary.json and formats.png here.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of the table.")
@click.option("--no-progress", is_flag=True, help="No progress bars on stderr.")
@user_errors
def bench_formats(engines: tuple[Path, ...], peers, out: Path | None, as_json: bool, no_progress: bool,
                  **options) -> None:
    """Plain decoding of ENGINES (fp32 / int8 / int4 builds of one model) against onnxruntime-genai int4, llama.cpp
    Q4 and OpenVINO GenAI int8 / int4 on the same token ids, speculation on top of each engine (and the peers' own
    prompt lookup), the verify cost curve and the memory-bandwidth floor of each format, and the quantization targets
    as pass / fail lines, from one run."""
    from trtspec.bench.formats import FormatsOptions, render_table, run_benchmark, write_outputs

    report = run_benchmark(FormatsOptions(engines=engines, peers=peers, **options),
                           show=lambda line: click.echo(line, err=True), progress=not no_progress)
    if out is not None:
        write_outputs(report, out)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(render_table(report)))
    if out is not None and not as_json:
        click.echo(f"wrote {out}/summary.json, {out}/formats.png")
