"""Medusa heads at their initialisation, for a base that has no trained heads yet.

Medusa initialises each ResBlock's weight to zero and each head's vocabulary projection from the base
lm_head; with a zero bias too, every head is the identity over the final hidden state and predicts what the
base predicts for the next position. Written in the FasterDecoding heads-only layout (`version: "2"`, no
per-head lm_head), so the artefact is a few hundred kilobytes and `trtspec convert --medusa` takes it as is.

    python -m trtspec.train.init_heads BASE_DIR OUT_DIR [--heads 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args()
    print(write_initial_medusa_heads(args.base, args.out, num_heads=args.heads, force=args.force))


if __name__ == "__main__":
    main()
