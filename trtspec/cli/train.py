"""train medusa / eagle: drafters by self-distillation."""

from __future__ import annotations

import json

import click

from trtspec.cli.app import DIR, EXISTING_DIR, cli, user_errors


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
        click.option("--lr", type=float, help="Peak learning rate (default: medusa 1e-3, eagle 5e-4, redrafter 1e-3)."),
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
    from trtspec.train import TrainOptions, train as run_training

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


@train.command("redrafter")
@_train_options
@click.option("--draft-len", type=int, default=4, show_default=True,
              help="Depths trained: depth d predicts token t+d+1 from the hidden state and the d tokens before it "
                   "(convert with --redrafter-draft-len-per-beam up to it).")
@click.option("--layers", type=int, default=1, show_default=True, help="ResBlock layers.")
@click.option("--rnn/--no-rnn", default=True, show_default=True,
              help="The recurrence over the beam's tokens (rnn_w, rnn_u); --no-rnn sums their embeddings.")
@click.option("--exit-dim", type=int, help="The drafter's width (default: 2 x hidden, no input projection).")
@click.option("--batch-size", type=int, default=256, show_default=True, help="Positions per optimizer step.")
@user_errors
def train_redrafter(as_json: bool, **flags) -> None:
    """A ReDrafter (Apple's recurrent drafter) over the base's hidden states, apple/ml-recurrent-drafter layout
    (config.json, model.safetensors), for `trtspec convert --redrafter`."""
    _train("redrafter", as_json, flags)
