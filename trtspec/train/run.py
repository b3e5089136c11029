"""`trtspec train medusa|eagle|redrafter`: self-distillation data → training (resumable) → held-out accuracy → export.

The output folder is written atomically at the end and holds the drafter in its released layout plus
`training.json` (options, timings, data size, per-head / per-depth accuracy). Work files (the data cache, the
base engine that generated it, the training checkpoint) live in a separate work folder, `<out>.work` by default.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from trtspec.checkpoint.hf_config import read_base_config
from trtspec.errors import ConfigError
from trtspec.outdir import atomic_output_dir, check_output_dir
from trtspec.train import eagle as E
from trtspec.train import medusa as M
from trtspec.train import redrafter as R
from trtspec.train.data import DataCache, DataSpec, check_prompt_source
from trtspec.train.heads import SharedLmHead, active_vocabulary, base_tensors
from trtspec.train.loop import CHECKPOINT_FILE, FitOptions, fingerprint_of, fit
from trtspec.speculative.method import Method

log = logging.getLogger(__name__)
METHODS = (Method.MEDUSA.value, Method.EAGLE.value, Method.REDRAFTER.value)  # the drafters trtspec trains
DEFAULT_LR = {"medusa": 1e-3, "eagle": 5e-4, "redrafter": 1e-3}
SAVE_DTYPES = {"float16": torch.float16, "float32": torch.float32, "bfloat16": torch.bfloat16}
RESULT_FILE = "training.json"


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """The `trtspec train` flags."""

    method: str
    base: Path
    out: Path
    prompts: str = "sharegpt"
    samples: int = 256
    eval_samples: int = 16
    max_new_tokens: int = 256
    max_prompt_tokens: int = 384
    epochs: int = 2
    lr: float | None = None  # None: DEFAULT_LR[method]
    batch_size: int = 256  # Medusa / ReDrafter: positions per step (EAGLE steps over one sequence)
    heads: int = 4  # Medusa
    layers: int = 1  # Medusa ResBlocks per head; ReDrafter ResBlocks
    draft_len: int = 4  # ReDrafter: depths trained (the beams' length it drafts well)
    rnn: bool = True  # ReDrafter: the recurrence over the beam's tokens (False: a running sum of embeddings)
    exit_dim: int | None = None  # ReDrafter: the drafter's width (default 2 x hidden, no input projection)
    noise: float = 0.1  # EAGLE: uniform feature noise half-width
    ce_weight: float = 0.1  # EAGLE: weight of the token cross-entropy next to the feature regression
    unroll: int = 1  # EAGLE: depths trained (training-time test); 1 = EAGLE-1
    draft_vocab: int = 0  # EAGLE: score only this many target ids (the labels' most used; d2t / t2d); 0 = all
    intermediate_size: int | None = None  # EAGLE: draft MLP width (default: the base's)
    with_embeddings: bool = False  # EAGLE: also store embed_tokens (a frozen base copy; convert falls back to the base)
    full_vocab_loss: bool = False  # training cross-entropy over the whole vocabulary, not just the labels used
    top_k: int = 10
    save_dtype: str = "float16"
    seed: int = 0
    resume: bool = False
    force: bool = False
    work: Path | None = None
    data: Path | None = None
    threads: int | None = None
    stop_after_steps: int | None = None  # library only: stop as if interrupted (tests of --resume)
    show_progress: bool = True

    def __post_init__(self):
        if self.method not in METHODS:
            raise ConfigError(f"unknown drafter {self.method!r}; trtspec trains {', '.join(METHODS)}")
        if self.save_dtype not in SAVE_DTYPES:
            raise ConfigError(f"--save-dtype {self.save_dtype!r} is not one of {', '.join(SAVE_DTYPES)}")
        for name in ("epochs", "batch_size", "heads", "layers", "top_k", "unroll", "draft_len"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.lr is not None and self.lr <= 0:
            raise ConfigError(f"--lr must be > 0, got {self.lr}")
        if self.draft_vocab < 0:
            raise ConfigError(f"--draft-vocab must be >= 0 (0: the whole vocabulary), got {self.draft_vocab}")
        if self.noise < 0 or self.ce_weight < 0:
            raise ConfigError(f"--noise and --ce-weight must be >= 0, got {self.noise} and {self.ce_weight}")
        if self.exit_dim is not None and self.exit_dim < 1:
            raise ConfigError(f"--exit-dim must be >= 1, got {self.exit_dim}")
        if self.resume and self.force:
            raise ConfigError("--resume continues the run in the work folder and --force starts over; pass one")

    @property
    def work_dir(self) -> Path:
        return self.work or self.out.with_name(self.out.name + ".work")

    @property
    def data_dir(self) -> Path:
        return self.data or self.work_dir / "data"


@dataclass(frozen=True)
class TrainResult:
    out: Path
    method: str
    report: dict  # what training.json holds


def train(opts: TrainOptions) -> TrainResult:
    """Generate (or reuse) the data, train, evaluate on the held-out prompts, export into opts.out."""
    start = time.perf_counter()
    cfg = read_base_config(opts.base)
    spec = DataSpec(base=str(Path(opts.base).resolve()), prompts=check_prompt_source(opts.prompts),
                    samples=opts.samples, eval_samples=opts.eval_samples, max_new_tokens=opts.max_new_tokens,
                    max_prompt_tokens=opts.max_prompt_tokens)
    check_output_dir(opts.out, force=opts.force or opts.resume)
    _check_work(opts)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    cache = _data(opts, spec, cfg.hidden_size)
    train_set, held_out = cache.samples()
    torch.manual_seed(opts.seed)  # the initial weights
    model, batches, loss = _model(opts, cfg, train_set)
    lr = opts.lr or DEFAULT_LR[opts.method]
    fit_opts = FitOptions(epochs=opts.epochs, lr=lr, seed=opts.seed, stop_after_steps=opts.stop_after_steps,
                          show_progress=opts.show_progress)
    fitted = fit(model, batches, loss, fit_opts, work=opts.work_dir, fingerprint=_fingerprint(opts, cache),
                 resume=opts.resume)
    if fitted.stopped_early:
        return TrainResult(opts.out, opts.method, {"stopped_after_steps": fitted.steps})
    draft_vocab = (E.select_draft_vocab(batches, opts.draft_vocab, cfg.vocab_size) if opts.method == "eagle"
                   else None)
    accuracy = (M.evaluate(model, held_out, opts.top_k) if opts.method == "medusa"
                else R.evaluate(model, held_out, opts.draft_len, opts.top_k) if opts.method == "redrafter"
                else E.evaluate(model, held_out, opts.top_k, draft_vocab=draft_vocab))
    report = _report(opts, cache, train_set, held_out, fitted, model, accuracy, lr, time.perf_counter() - start)
    _export(opts, cfg, model, report, draft_vocab)
    return TrainResult(opts.out, opts.method, report)


def _report(opts, cache, train_set, held_out, fitted, model, accuracy: dict, lr: float, seconds: float) -> dict:
    """What training.json holds: the options, the data, the run, the held-out accuracy."""
    data = {"directory": str(cache.directory), "train_sequences": len(train_set), "held_out_sequences": len(held_out),
            "tokens": int(sum(len(s.ids) for s in train_set)),
            "reply_tokens": int(sum(len(s.ids) - s.prompt_len for s in train_set)),
            "bytes": cache.size_bytes(), "generation_seconds": round(cache.generation_seconds, 1)}
    run = {"steps": fitted.steps, "seconds": round(fitted.seconds, 1),
           "epoch_losses": [round(x, 4) for x in fitted.epoch_losses],
           "active_vocabulary": int(model.lm_head.active_weight.shape[0])}
    return {"method": opts.method, "command_options": _options_dict(opts), "lr": lr, "data": data, "training": run,
            "accuracy": accuracy, "seconds": round(seconds, 1)}


def _check_work(opts: TrainOptions) -> None:
    checkpoint = opts.work_dir / CHECKPOINT_FILE
    if checkpoint.is_file() and not (opts.resume or opts.force):
        raise ConfigError(f"{checkpoint} holds an unfinished or finished run; pass --resume to continue it or "
                          "--force to start over")
    if opts.force and checkpoint.is_file():
        checkpoint.unlink()
    opts.work_dir.mkdir(parents=True, exist_ok=True)


def _data(opts: TrainOptions, spec: DataSpec, hidden_size: int) -> DataCache:
    cache = DataCache(opts.data_dir, spec, hidden_size)
    if not cache.complete:
        from trtspec.train.distill import build_base_engine, generate_data

        engine = build_base_engine(Path(opts.base), opts.work_dir, max_input_len=opts.max_prompt_tokens,
                                   max_seq_len=opts.max_prompt_tokens + opts.max_new_tokens + 2)
        generate_data(engine, cache, threads=opts.threads, show_progress=opts.show_progress)
    log.info("data: %d sequences, %.1f MiB of tokens and float16 features in %s", len(cache.rows),
             cache.size_bytes() / 2**20, cache.directory)
    return cache


def _model(opts: TrainOptions, cfg, train_set):
    embed, lm_weight = base_tensors(Path(opts.base), cfg)
    if opts.method == "medusa":
        _, labels = M.positions(train_set, opts.heads)
        lm_head = SharedLmHead(lm_weight, None if opts.full_vocab_loss else active_vocabulary([labels], cfg.vocab_size))
        model = M.MedusaHeadsModule(cfg.hidden_size, opts.heads, opts.layers, lm_head)
        return model, M.make_batches(train_set, opts.heads, opts.batch_size), M.loss_fn(model)
    if opts.method == "redrafter":
        batches = R.make_batches(train_set, opts.draft_len, opts.batch_size)
        lm_head = SharedLmHead(lm_weight, None if opts.full_vocab_loss
                               else active_vocabulary([b.labels for b in batches], cfg.vocab_size))
        model = R.ReDrafterModule(embed, lm_head, num_layers=opts.layers, rnn=opts.rnn,
                                  exit_dim=opts.exit_dim or 2 * cfg.hidden_size)
        return model, batches, R.loss_fn(model)
    batches = [E.sequence(s) for s in train_set]
    batches = [b for b in batches if (b.labels != -100).any()]
    lm_head = SharedLmHead(lm_weight, None if opts.full_vocab_loss
                           else active_vocabulary([b.labels for b in batches], cfg.vocab_size))
    model = E.EagleDraftModule(E.draft_config(cfg, opts.intermediate_size), embed, lm_head)
    return model, batches, E.loss_fn(model, opts.noise, opts.ce_weight, opts.unroll)


def _export(opts: TrainOptions, cfg, model, report: dict, draft_vocab) -> None:
    dtype = SAVE_DTYPES[opts.save_dtype]
    extra = {"trained_by": "trtspec train", "prompts": opts.prompts, "samples": opts.samples, "epochs": opts.epochs,
             "seed": opts.seed}
    base = Path(opts.base).resolve()
    with atomic_output_dir(opts.out, force=True) as tmp:
        if opts.method == "medusa":
            M.export(model, tmp, base=base, dtype=dtype, extra=extra)
        elif opts.method == "redrafter":
            R.export(model, tmp, dtype=dtype, extra=extra)
        else:
            E.export(model, tmp, base=base, cfg=cfg, dtype=dtype, with_embeddings=opts.with_embeddings, extra=extra,
                     draft_vocab=draft_vocab)
        (tmp / RESULT_FILE).write_text(json.dumps(report, indent=2) + "\n")


METHOD_OPTIONS = {"medusa": ("heads", "layers", "batch_size"),
                  "eagle": ("noise", "ce_weight", "unroll", "draft_vocab", "intermediate_size", "with_embeddings"),
                  "redrafter": ("layers", "batch_size", "draft_len", "rnn", "exit_dim")}


def _options_dict(opts: TrainOptions) -> dict:
    others = {o for m in METHODS if m != opts.method for o in METHOD_OPTIONS[m]} - set(METHOD_OPTIONS[opts.method])
    skip = {"show_progress", "stop_after_steps", "resume", "force", "threads", *others}
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items() if k not in skip}


def _fingerprint(opts: TrainOptions, cache: DataCache) -> dict:
    keep = ("method", "epochs", "lr", "batch_size", "heads", "layers", "noise", "ce_weight", "unroll",
            "intermediate_size", "full_vocab_loss", "seed", "draft_len", "rnn", "exit_dim")
    return fingerprint_of(data=asdict(cache.spec), **{k: getattr(opts, k) for k in keep})
