"""datastore build / inspect: corpora for the suffix drafter."""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.cli.app import EXISTING_DIR, cli, user_errors


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
    from trtspec.data import build_datastore

    store = build_datastore(sources, out, tokenizer=tokenizer, max_ngram=max_ngram, max_tokens=max_tokens,
                            limit=limit, force=force, progress=not as_json)
    _print_datastore(store, as_json)


@datastore.command("inspect")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True)
@user_errors
def datastore_inspect(file: Path, as_json: bool) -> None:
    """Describe a datastore file (and check its integrity)."""
    from trtspec.speculative import Datastore

    _print_datastore(Datastore.load(file), as_json)


def _print_datastore(store, as_json: bool) -> None:
    d = store.describe()
    if as_json:
        click.echo(json.dumps(d))
        return
    click.echo(f"{d['path']}: {d['tokens']:,} tokens in {d['documents']:,} documents, n-grams 1..{d['max_ngram']}, "
               f"{d['bytes'] / 2**20:.1f} MiB, vocabulary {d['vocab_size']}, from {', '.join(d['sources'])}")
