"""Medusa heads at their initialisation, for a base that has no trained heads yet.

Medusa initialises each ResBlock's weight to zero and each head's vocabulary projection from the base
lm_head; with a zero bias too, every head is the identity over the final hidden state and predicts what the
base predicts for the next position. Written in the FasterDecoding heads-only layout (`version: "2"`, no
per-head lm_head), so the artefact is a few hundred kilobytes and `trtspec convert --medusa` takes it as is.

    python -m trtspec.train.init_heads BASE_DIR OUT_DIR [--heads 4]
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from trtspec.checkpoint.hf_config import read_base_config
from trtspec.outdir import atomic_output_dir


def write_initial_medusa_heads(base_dir: Path, out_dir: Path, *, num_heads: int = 4, num_layers: int = 1,
                               force: bool = False) -> Path:
    """Write identity-initialised Medusa heads sized for the base at base_dir."""
    import torch
    from safetensors.torch import save_file

    cfg = read_base_config(base_dir)
    h = cfg.hidden_size
    tensors = {}
    for head in range(num_heads):
        for layer in range(num_layers):
            tensors[f"{head}.{layer}.linear.weight"] = torch.zeros(h, h)
            tensors[f"{head}.{layer}.linear.bias"] = torch.zeros(h)
    config = {"medusa_num_heads": num_heads, "medusa_num_layers": num_layers, "version": "2",
              "base_model_name_or_path": str(Path(base_dir).resolve()), "trtspec_init": "identity"}
    with atomic_output_dir(Path(out_dir), force=force) as tmp:
        save_file(tensors, tmp / "medusa_lm_head.safetensors")
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return Path(out_dir)


@click.command()
@click.argument("base", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--heads", type=click.IntRange(min=1), default=4, show_default=True, help="Medusa heads to write.")
@click.option("--force", is_flag=True, help="Replace OUT if it exists.")
def main(base: Path, out: Path, heads: int, force: bool) -> None:
    """Identity-initialised Medusa heads for the base at BASE, written to OUT."""
    click.echo(write_initial_medusa_heads(base, out, num_heads=heads, force=force))


if __name__ == "__main__":
    main(prog_name="python -m trtspec.train.init_heads")
