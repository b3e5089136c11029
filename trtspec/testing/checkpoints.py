"""Tiny TensorRT-LLM checkpoints with a drafter, converted from factory checkpoints: the fixture tests share."""

from __future__ import annotations

from pathlib import Path

from trtspec.testing.factory import TinyModel, write_eagle_draft, write_hf_base, write_medusa_heads

DRAFTERS = ("none", "medusa", "eagle")


def tiny_trtllm_checkpoints(root: Path, model: TinyModel, drafters=DRAFTERS, *, num_medusa_heads: int = 3,
                            **convert_options) -> dict[str, Path]:
    """Write one base and convert it once per drafter ("none", "medusa", "eagle") into root/ckpt-{drafter}."""
    from trtspec.checkpoint.convert import ConvertOptions, convert

    root = Path(root)
    base = write_hf_base(root / "base", model)
    out = {}
    for name in drafters:
        drafter = {}
        if name == "medusa":
            drafter["medusa"] = write_medusa_heads(root / "heads", model, num_heads=num_medusa_heads)
        elif name == "eagle":
            drafter["eagle"] = write_eagle_draft(root / "eagle", model)
        out[name] = root / f"ckpt-{name}"
        convert(ConvertOptions(base=base, out=out[name], **drafter, **convert_options), show_progress=False)
    return out


def tiny_engine(root: Path, model: TinyModel | None = None, drafter: str = "medusa", **build_options) -> Path:
    """A tiny tokenizer, a tiny random checkpoint (`drafter`: none / medusa / eagle) and its CPU engine under root;
    the model's vocabulary is the tokenizer's. Returns the engine folder."""
    from dataclasses import replace

    from trtspec.engine.onnx_builder import BuildOptions, build
    from trtspec.testing.tokenizers import write_tiny_tokenizer

    root = Path(root)
    vocab = write_tiny_tokenizer(root / "tokenizer")
    model = replace(model or TinyModel(), vocab_size=vocab)
    ckpt = tiny_trtllm_checkpoints(root, model, (drafter,))[drafter]
    build(BuildOptions(source=ckpt, out=root / "engine", tokenizer=root / "tokenizer", **build_options))
    return root / "engine"
