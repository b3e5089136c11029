"""The training loop both drafters share: AdamW, warmup + cosine schedule, resumable checkpoints, determinism.

Every random draw (batch order, feature noise) comes from a generator seeded by (seed, epoch) or (seed, step),
never from global state, so a run stopped and resumed takes exactly the same steps as one that never stopped.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from trtspec.errors import ConfigError
from trtspec.progress import StatusBar

log = logging.getLogger(__name__)
CHECKPOINT_FILE = "checkpoint.pt"
SAVE_EVERY_S = 120.0


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    epochs: int
    lr: float
    seed: int
    warmup: float = 0.05  # fraction of the steps
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    stop_after_steps: int | None = None  # stop early as if interrupted (tests of --resume)
    show_progress: bool = True


@dataclass
class FitResult:
    steps: int
    seconds: float
    epoch_losses: list[float] = field(default_factory=list)  # mean training loss of each epoch
    stopped_early: bool = False


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Linear warmup to 1, then cosine decay to 0.05 at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def epoch_order(seed: int, epoch: int, n: int) -> list[int]:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 7919 + epoch)).tolist()


LossFn = Callable[[object, torch.Generator], tuple[torch.Tensor, int]]  # (batch, gen) -> (mean loss, weight)


def fit(module: nn.Module, batches: Sequence, loss_fn: LossFn, opts: FitOptions, *, work: Path,
        fingerprint: dict, resume: bool) -> FitResult:
    """Train `module` over `batches` (in a seeded order per epoch) for opts.epochs, checkpointing into work/."""
    params = [p for p in module.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(params, lr=opts.lr, betas=(0.9, 0.95), weight_decay=opts.weight_decay)
    per_epoch, total = len(batches), len(batches) * opts.epochs
    warmup = max(1, int(opts.warmup * total))
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(s, total, warmup))
    step, sums = 0, [[0.0, 0] for _ in range(opts.epochs)]
    if resume:
        step, sums = _load(work / CHECKPOINT_FILE, module, optim, sched, fingerprint)
    start, last_save = time.perf_counter(), time.perf_counter()
    result = FitResult(step, 0.0)
    for epoch in range(step // per_epoch, opts.epochs):
        order = epoch_order(opts.seed, epoch, per_epoch)
        with StatusBar(f"epoch {epoch + 1}/{opts.epochs}", total=per_epoch, enabled=opts.show_progress) as bar:
            bar.advance(step - epoch * per_epoch)
            for i in order[step - epoch * per_epoch:]:
                loss, weight = loss_fn(batches[i], step_generator(opts.seed, step))
                optim.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, opts.grad_clip)
                optim.step()
                sched.step()
                step += 1
                sums[epoch][0] += float(loss.detach()) * weight
                sums[epoch][1] += weight
                bar.advance(1, f"loss {sums[epoch][0] / max(1, sums[epoch][1]):.4f}")
                if opts.stop_after_steps is not None and step >= opts.stop_after_steps:
                    _save(work / CHECKPOINT_FILE, module, optim, sched, step, sums, fingerprint)
                    result.stopped_early = True
                    break
                if time.perf_counter() - last_save > SAVE_EVERY_S:
                    _save(work / CHECKPOINT_FILE, module, optim, sched, step, sums, fingerprint)
                    last_save = time.perf_counter()
        if result.stopped_early:
            break
        _save(work / CHECKPOINT_FILE, module, optim, sched, step, sums, fingerprint)
        log.info("epoch %d/%d: mean loss %.4f", epoch + 1, opts.epochs, sums[epoch][0] / max(1, sums[epoch][1]))
    result.steps, result.seconds = step, time.perf_counter() - start
    result.epoch_losses = [s / max(1, n) for s, n in sums if n]
    return result


def _save(path: Path, module, optim, sched, step: int, sums, fingerprint: dict) -> None:
    """Write the checkpoint atomically (a stopped run never leaves a torn file)."""
    state = {"step": step, "sums": sums, "fingerprint": fingerprint, "module": module.state_dict(),
             "optim": optim.state_dict(), "sched": sched.state_dict()}
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _load(path: Path, module, optim, sched, fingerprint: dict) -> tuple[int, list]:
    if not path.is_file():
        raise ConfigError(f"--resume: no checkpoint at {path}; run without --resume to start training")
    state = torch.load(path, weights_only=True)
    if state["fingerprint"] != fingerprint:
        diff = sorted(k for k in fingerprint if state["fingerprint"].get(k) != fingerprint[k])
        shown = ", ".join(f"{k}={state['fingerprint'].get(k)!r} (now {fingerprint[k]!r})" for k in diff[:3])
        raise ConfigError(f"--resume: {path} was made with other options: {shown}; use the same options, or "
                          "drop --resume and pass --force to start over")
    module.load_state_dict(state["module"])
    optim.load_state_dict(state["optim"])
    sched.load_state_dict(state["sched"])
    log.info("resuming from %s at step %d", path, state["step"])
    return state["step"], state["sums"]


def fingerprint_of(**options) -> dict:
    """A JSON-comparable record of everything that shapes the training run."""
    return json.loads(json.dumps(options, default=str))
