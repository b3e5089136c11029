"""What the activation rounding of a prompt's products costs in quality: a Hugging Face model with every linear
layer's weights rounded as trtspec stores them (int8 in blocks of 32) and its inputs rounded to int8 per row in
groups of G columns, scored against the same model in float32 over real prompts (teacher-forced: every prompt
position's next-token distribution).

    .venv/bin/python benchmarks/prefill_numerics.py --hf MODEL --sets sharegpt-grounded,code-edit --limit 6

G = 32 is MatMulNBits at accuracy level 4 (what trtspec's int8 and int4 engines compute); a whole row (one scale per
token) is what a GEMM with row × column scales (ONNX Runtime's integer MatMul kernels) needs; `--smooth ALPHA`
first moves activation outliers into the weights (SmoothQuant: x / s, W · s, s_j = max|x_j|^α / max|W_j|^(1-α),
calibrated on other prompts), with the weights then rounded per output channel.
"""

from __future__ import annotations

import click
import numpy as np

GROUPS = ("32", "64", "192", "row")


def round_rows(x, group: int | None):
    """x [..., K] rounded to int8 per row, one scale per `group` columns (None: per row) — and back to float."""
    import torch

    k = x.shape[-1]
    size = k if group is None else group
    blocks = x.reshape(*x.shape[:-1], k // size, size)
    scale = blocks.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
    return (torch.round(blocks / scale).clamp(-127, 127) * scale).reshape(x.shape)


def round_weight(w, per_channel: bool):
    """W [N, K] rounded to int8 as trtspec stores it (blocks of 32 along K) or per output channel."""
    import torch

    from trtspec.model.quantize import fake_quantize

    if per_channel:
        scale = w.abs().amax(1, keepdim=True).clamp_min(1e-12) / 127
        return torch.round(w / scale).clamp(-127, 127) * scale
    return torch.from_numpy(fake_quantize(w.numpy(), 8, 32))


def scores(outputs, reference) -> dict:
    """Top-1 agreement with float32 over every position, and the mean KL(fp32 || rounded) per position."""
    import torch.nn.functional as F

    agree = [float((o.argmax(-1) == r.argmax(-1)).float().mean()) for o, r in zip(outputs, reference)]
    kl = [float(F.kl_div(o.log_softmax(-1), r.log_softmax(-1), log_target=True, reduction="batchmean"))
          for o, r in zip(outputs, reference)]
    return {"top1": float(np.mean(agree)), "kl": float(np.mean(kl))}


@click.command()
@click.option("--hf", "model_dir", required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--sets", default="sharegpt-grounded,code-edit", show_default=True)
@click.option("--limit", default=6, show_default=True, type=click.IntRange(1))
@click.option("--smooth", "alphas", default="0.5", show_default=True, help="SmoothQuant α values, comma-separated")
def main(model_dir: str, sets: str, limit: int, alphas: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trtspec.data.prompts import load_prompts

    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def encode(prompt) -> list[int]:
        text = tokenizer.apply_chat_template(list(prompt.messages), add_generation_prompt=True, tokenize=False)
        return tokenizer(text, add_special_tokens=False).input_ids

    names = sets.split(",")
    prompts = [encode(p) for name in names for p in load_prompts(name, limit=limit, split="measure")]
    calibration = [encode(p) for name in names for p in load_prompts(name, limit=4, split="tune")]
    linears = [m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and "lm_head" not in n]
    weights = {m: m.weight.data.clone() for m in linears}
    state = {"group": None, "smooth": {}}

    def hook(module, args):
        if state["group"] is None:
            return None
        x = args[0] / state["smooth"][module] if state["smooth"] else args[0]
        return (round_rows(x, None if state["group"] == "row" else int(state["group"])),)

    for m in linears:
        m.register_forward_pre_hook(hook)

    def run(ids_list):
        with torch.no_grad():
            return [model(torch.tensor([ids])).logits[0] for ids in ids_list]

    reference = run(prompts)
    print(f"{len(prompts)} prompts ({sets}, first {limit} of each measure split), {sum(map(len, prompts))} positions")
    print(f"{'weights':24s} {'activations':14s} {'top-1 vs fp32':>14s} {'KL':>9s}")
    for m in linears:
        m.weight.data = round_weight(weights[m], per_channel=False)
    for group in ("none",) + GROUPS:
        state["group"] = None if group == "none" else group
        s = scores(run(prompts), reference)
        print(f"{'int8 blocks of 32':24s} {group:14s} {s['top1']:14.4f} {s['kl']:9.5f}")
    peaks = {}
    state["group"] = None
    calibrate = [m.register_forward_pre_hook(lambda mod, a: peaks.__setitem__(
        mod, torch.maximum(peaks.get(mod, torch.zeros(a[0].shape[-1])), a[0].abs().reshape(-1, a[0].shape[-1]).amax(0))))
        for m in linears]
    run(calibration)
    for handle in calibrate:
        handle.remove()
    for alpha in (float(a) for a in alphas.split(",")):
        for m in linears:
            s = (peaks[m].clamp_min(1e-5) ** alpha / weights[m].abs().amax(0).clamp_min(1e-5) ** (1 - alpha))
            state["smooth"][m] = s.clamp_min(1e-5)
            m.weight.data = round_weight(weights[m] * state["smooth"][m], per_channel=True)
        for group in ("row", "192"):
            state["group"] = group
            s = scores(run(prompts), reference)
            print(f"{f'smoothed α {alpha}, per channel':24s} {group:14s} {s['top1']:14.4f} {s['kl']:9.5f}")
        state["smooth"] = {}


if __name__ == "__main__":
    main()
