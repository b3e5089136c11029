"""The interleaved loop every system's runner shares (`alternate`), the peers' greedy runners (onnxruntime-genai,
llama.cpp, OpenVINO GenAI, transformers: plain decoding and each one's own speculation), and the child process each
system runs in, so that no two share threads, allocators or warm caches: `run_child("trtspec.bench.peers:run_genai",
{...})` runs `python -m trtspec.bench.peers`, which prints the named runner's rows as JSON lines.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from trtspec.errors import ConfigError
from trtspec.speculative.method import PLAIN

GENAI_MODULES = ("onnxruntime_genai", "onnx_ir")  # the builder imports onnx_ir but does not declare it
GENAI_INSTALL = "pip install onnxruntime-genai onnx-ir"
LLAMA_CPP_MODULES = ("llama_cpp",)
LLAMA_CPP_INSTALL = "bash scripts/setup-peers.sh builds llama-cpp-python from source"
OPENVINO_MODULES = ("openvino_genai", "openvino", "openvino_tokenizers")
OPENVINO_INSTALL = "PEERS=openvino bash scripts/setup-peers.sh installs OpenVINO GenAI and its exporter"
TRANSFORMERS_MODULES = ("transformers", "torch")
TRANSFORMERS_INSTALL = "pip install 'trtspec[build]'"
GENAI_CONFIG = "genai_config.json"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # every child and builder: local files only
WARMUP_TOKENS = 8  # a short generation before timing: first-run allocations and lazy initialisation
LOOKUP = "lookup"  # a row's run of the peer's own speculation
# OpenVINO's model exporter (optimum-intel's `optimum-cli export openvino`) lives in a venv of its own, which
# scripts/setup-peers.sh makes: optimum-intel needs an older transformers than trtspec's venv holds
OPENVINO_EXPORTER = Path(__file__).resolve().parents[2] / ".venv-tools" / "openvino-export" / "bin" / "optimum-cli"
OPENVINO_IR = "openvino_model.xml"
# optimum-cli's weight compression (nncf) per weight format, matched to trtspec's engines of that format:
# - int8: asymmetric per output channel on every matrix, OpenVINO's default int8 layout (its CPU kernels' fast path),
#   about as precise as trtspec's symmetric block-32 int8.
# - int4: symmetric, group 32, every matrix (--ratio 1.0, --all-layers: the tied lm_head too): trtspec's int4 grid, so
#   neither side's quality comes from a finer format (group 128 is OpenVINO's fastest, but buys speed with quality).
OPENVINO_WEIGHTS = {
    "fp32": ("--weight-format", "fp32"),
    "int8": ("--weight-format", "int8"),
    "int4": ("--weight-format", "int4", "--group-size", "32", "--ratio", "1.0", "--sym", "--all-layers"),
}
# prompt lookup's (max_ngram_size, num_assistant_tokens): openvino.genai's prompt lookup sample's values
OPENVINO_LOOKUP_SETTINGS = (3, 5)


def _run_offline(cmd: list[str], log: Path) -> int:
    """A peer's model builder or exporter, offline, its output into `log`: its exit code."""
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **OFFLINE}).returncode


def missing_modules(modules: Iterable[str]) -> list[str]:
    """Return the modules of `modules` that are not installed (located, never imported)."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def sample(output_ids, start: float, first: float, end: float, **extra) -> dict:
    """One timed generation: its new ids, time to first token and total time (and what else the runner counts)."""
    return {"output_ids": [int(t) for t in output_ids], "ttft_s": first - start, "total_s": end - start, **extra}


def rotated(items: Iterable, n: int) -> list:
    """`items` turned left by n places: the order of the methods (or targets) for the n-th prompt or group, so that
    none always runs first or last while the machine drifts."""
    items = list(items)
    n %= len(items)
    return items[n:] + items[:n]


def alternate(prompts: list[list[int]], max_tokens: int, runners: dict[str, Callable[[list[int], int], dict]], *,
              before: Callable[[int], None] = lambda index: None) -> Iterator[dict]:
    """Every prompt through each runner (plain decoding, each method), the order `rotated` from prompt to prompt,
    after a short warm-up of each; `before(index)` runs ahead of each prompt. One row per prompt, {"prompt": index,
    "runs": {name: sample}}."""
    for run in runners.values():
        run(prompts[0], WARMUP_TOKENS)
    for index, ids in enumerate(prompts):
        before(index)
        yield {"prompt": index, "runs": {name: runners[name](ids, max_tokens) for name in rotated(runners, index)}}


def _with_lookup(prompts: list[list[int]], max_tokens: int, runner: Callable, lookup) -> Iterator[dict]:
    """`alternate` over a peer's plain decoding, `runner(None)`, and, given its `lookup` settings, its own
    speculation, `runner(lookup)`."""
    return alternate(prompts, max_tokens, {PLAIN: runner(None), **({LOOKUP: runner(lookup)} if lookup else {})})


# ---- onnxruntime-genai --------------------------------------------------------------------------------------

def build_genai_model(hf_dir: Path, out: Path, *, log: Path, precision: str = "fp32") -> Path:
    """onnxruntime-genai's model builder on a local HF folder (CPU, `precision` fp32 or int4 at its CPU defaults,
    block 32, accuracy level 4); a finished build is reused."""
    if (out / GENAI_CONFIG).is_file():
        return out
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir), "-o", str(out),
           "-p", precision, "-e", "cpu", "-c", str(out.parent / "genai-cache")]
    if (code := _run_offline(cmd, log)) or not (out / GENAI_CONFIG).is_file():
        raise ConfigError(f"onnxruntime-genai's model builder failed (exit code {code}); see {log}")
    return out


def run_genai(model: str, prompts: list[list[int]], *, max_tokens: int, threads: int,
              lookup: tuple[int, int] | None = None) -> Iterator[dict]:
    """Greedy search with onnxruntime-genai's Generator and, with `lookup` = (ngram_size, max_draft_tokens), its own
    n-gram speculation (`set_speculative_options`), alternating per prompt."""
    import onnxruntime_genai as og

    config = og.Config(model)
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    loaded = og.Model(config)

    def runner(lookup: tuple[int, int] | None):
        def generate(ids: list[int], new_tokens: int) -> dict:
            params = og.GeneratorParams(loaded)
            params.set_search_options(do_sample=False, max_length=len(ids) + new_tokens)
            if lookup:
                params.set_speculative_options(ngram_size=lookup[0], max_draft_tokens=lookup[1])
            start = time.perf_counter()
            generator = og.Generator(loaded, params)
            generator.append_tokens([ids])  # runs the prompt
            generator.generate_next_token()  # picks the first token from the prompt's logits
            first = time.perf_counter()
            while not generator.is_done():
                generator.generate_next_token()
            return sample(list(generator.get_sequence(0))[len(ids):], start, first, time.perf_counter())
        return generate

    yield from _with_lookup(prompts, max_tokens, runner, lookup)


# ---- llama.cpp ----------------------------------------------------------------------------------------------

def run_llama_cpp(model: str, prompts: list[list[int]], *, max_tokens: int, threads: int,
                  lookup: tuple[int, int] | None = None) -> Iterator[dict]:
    """Greedy decoding of a GGUF model with llama-cpp-python, every prompt from an empty cache (`Llama.reset`: no
    other system reuses the previous prompt's common prefix) and, with `lookup` = (max_ngram_size, num_pred_tokens),
    its own prompt lookup (`LlamaPromptLookupDecoding` drafting for a second Llama), alternating per prompt."""
    from llama_cpp import Llama

    n_ctx = max(len(ids) for ids in prompts) + max_tokens + 8 + (lookup[1] if lookup else 0)

    def runner(lookup: tuple[int, int] | None):
        draft = None
        if lookup:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = _CountingDraft(LlamaPromptLookupDecoding(max_ngram_size=lookup[0], num_pred_tokens=lookup[1]))
        # with a draft model, Llama keeps every position's logits but sizes that array by the logits_all argument
        # (llama-cpp-python 0.3.36 `Llama.__init__`): without logits_all=True a sequence past n_batch tokens overflows
        loaded = Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False,
                       draft_model=draft, logits_all=draft is not None)
        eos = loaded.token_eos()

        def generate(ids: list[int], new_tokens: int) -> dict:
            out: list[int] = []
            loaded.reset()
            if draft is not None:
                draft.drafted = draft.calls = 0
            start = first = time.perf_counter()
            for token in loaded.generate(ids, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0,
                                         reset=True):
                if not out:
                    first = time.perf_counter()
                out.append(int(token))
                if token == eos or len(out) >= new_tokens:
                    break
            extra = {} if draft is None else {"drafted": draft.drafted, "steps": draft.calls}
            return sample(out, start, first, time.perf_counter(), **extra)
        return generate

    yield from _with_lookup(prompts, max_tokens, runner, lookup)


class _CountingDraft:
    """A llama-cpp-python draft model counting its calls and drafted tokens: `Llama.generate` asks for one draft per
    evaluation, so its calls are the decode steps."""

    def __init__(self, draft):
        self.draft, self.drafted, self.calls = draft, 0, 0

    def __call__(self, input_ids, /, **kwargs):
        tokens = self.draft(input_ids, **kwargs)
        self.drafted += len(tokens)
        self.calls += 1
        return tokens


# ---- OpenVINO GenAI -----------------------------------------------------------------------------------------

def build_openvino_model(hf_dir: Path, out: Path, *, log: Path, weights: str = "int8") -> Path:
    """A local HF folder exported to OpenVINO IR by optimum-intel at `OPENVINO_WEIGHTS[weights]`; a finished export
    is reused (it lands in `out` only once complete, so a failed or interrupted one never is)."""
    if (out / OPENVINO_IR).is_file():
        return out
    if weights not in OPENVINO_WEIGHTS:
        raise ConfigError(f"OpenVINO weight format {weights}: choose from {', '.join(OPENVINO_WEIGHTS)}")
    if not OPENVINO_EXPORTER.is_file():
        raise ConfigError(f"OpenVINO's exporter is not installed ({OPENVINO_EXPORTER}): run `{OPENVINO_INSTALL}`")
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [str(OPENVINO_EXPORTER), "export", "openvino", "--model", str(hf_dir), "--task", "text-generation-with-past",
           *OPENVINO_WEIGHTS[weights], str(partial)]
    if (code := _run_offline(cmd, log)) or not (partial / OPENVINO_IR).is_file():
        raise ConfigError(f"OpenVINO's export of {hf_dir} ({weights}) failed (exit code {code}); see {log}")
    partial.rename(out)
    return out


def _openvino_generate(pipeline, ids: list[int], config) -> tuple[list[int], float, float, float, int]:
    """One generation from token ids (an int64 tensor: nothing tokenized or added): the new ids, start, first-token
    and end times, and the streamer's calls. The streamer gets each step's new tokens at once, so every call after
    the first (the prompt's token) is one decode step."""
    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    class Clock(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.first, self.calls = None, 0

        def write(self, token):
            if self.first is None:
                self.first = time.perf_counter()
            self.calls += 1
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    clock = Clock()
    tensor = ov.Tensor(np.asarray([ids], dtype=np.int64))
    start = time.perf_counter()
    result = pipeline.generate(tensor, config, clock)
    end = time.perf_counter()
    return [int(t) for t in result.tokens[0]], start, clock.first or end, end, clock.calls


def run_openvino(model: str, prompts: list[list[int]], *, max_tokens: int, threads: int,
                 lookup: tuple[int, int] | None = None) -> Iterator[dict]:
    """Greedy decoding with OpenVINO GenAI's `LLMPipeline` on the CPU and, with `lookup` = (max_ngram_size,
    num_assistant_tokens), its own prompt lookup (a second pipeline with `prompt_lookup=True`) counting its decode
    steps, alternating per prompt."""
    import openvino_genai as ov_genai

    def runner(lookup: tuple[int, int] | None):
        pipeline = ov_genai.LLMPipeline(model, "CPU", INFERENCE_NUM_THREADS=threads,
                                        **({"prompt_lookup": True} if lookup else {}))
        own = pipeline.get_generation_config()

        def generate(ids: list[int], new_tokens: int) -> dict:
            # greedy, stopping where the model's generation_config.json says
            config = ov_genai.GenerationConfig()
            config.max_new_tokens = new_tokens
            config.do_sample = False
            config.apply_chat_template = False  # for text input only; token ids go in as they are (no template, no BOS)
            config.eos_token_id = own.eos_token_id
            config.stop_token_ids = own.stop_token_ids
            if lookup:
                config.max_ngram_size, config.num_assistant_tokens = lookup
            out, start, first, end, calls = _openvino_generate(pipeline, ids, config)
            return sample(out, start, first, end, **({"steps": max(0, calls - 1)} if lookup else {}))
        return generate

    yield from _with_lookup(prompts, max_tokens, runner, lookup)


# ---- transformers -------------------------------------------------------------------------------------------

class _FirstTokenClock:
    """A generate() streamer that notes when the first new token arrives (the first put() is the prompt)."""

    def __init__(self):
        self.puts, self.first = 0, None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


def run_transformers(model: str, prompts: list[list[int]], *, max_tokens: int, threads: int,
                     lookup: int | None = None) -> Iterator[dict]:
    """Greedy `generate` of Hugging Face transformers in fp32 and, with `lookup` (prompt_lookup_num_tokens), its own
    prompt lookup, alternating per prompt."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    eos = loaded.generation_config.eos_token_id

    def runner(lookup: int | None):
        extra = {"prompt_lookup_num_tokens": lookup} if lookup else {}

        def generate(ids: list[int], new_tokens: int) -> dict:
            x = torch.tensor([ids])
            clock = _FirstTokenClock()
            start = time.perf_counter()
            with torch.inference_mode():
                out = loaded.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                      do_sample=False, pad_token_id=eos, streamer=clock, **extra)
            end = time.perf_counter()
            return sample(out[0, len(ids):].tolist(), start, clock.first or end, end)
        return generate

    yield from _with_lookup(prompts, max_tokens, runner, lookup)


# ---- the child process --------------------------------------------------------------------------------------

def run_child(function: str, kwargs: dict, *, log: Path, on_row: Callable[[dict], None] = lambda row: None,
              threads: int | None = None) -> list[dict]:
    """Call `module:function` (in trtspec.bench) in a fresh interpreter; return its rows, passing each to on_row."""
    env = {**os.environ, **OFFLINE}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    rows = []
    with open(log, "a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "trtspec.bench.peers", function], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        proc.stdin.write(json.dumps(kwargs))
        proc.stdin.close()
        for line in proc.stdout:
            row = json.loads(line)
            if "user_error" in row:  # the child's one-line error about its input (main)
                proc.wait()
                raise ConfigError(row["user_error"])
            rows.append(row)
            on_row(row)
        code = proc.wait()
    if code:
        tail = "".join(Path(log).read_text().splitlines(keepends=True)[-5:]).strip()
        raise ConfigError(f"{function} failed in its child process (exit code {code}); see {log}:\n{tail}")
    return rows


def _resolve(function: str) -> Callable:
    module, _, name = function.partition(":")
    if not module.startswith(("trtspec.bench.", "benchmarks.")) or not name:
        raise ConfigError(f"{function!r}: expected trtspec.bench.<module>:<function> (or benchmarks.<module>:...)")
    return getattr(importlib.import_module(module), name)


def main(argv: list[str] | None = None) -> None:
    from trtspec.errors import TrtspecError

    (function,) = argv if argv is not None else sys.argv[1:]
    try:
        result = _resolve(function)(**json.loads(sys.stdin.read()))
        for row in [result] if isinstance(result, dict) else result:
            print(json.dumps(row), flush=True)
    except TrtspecError as e:
        print(json.dumps({"user_error": str(e)}), flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
