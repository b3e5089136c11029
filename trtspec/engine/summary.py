"""`trtspec inspect ENGINE_DIR`: what a built engine holds, from its manifest (and its cached verify curve)."""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.engine.manifest import MANIFEST_FILE, MATMUL_BLOCK, read_manifest

CURVE_FILE = "verify_curve.json"  # written by runtime.verify_curve beside the engine


def is_engine_dir(directory: Path) -> bool:
    return (Path(directory) / MANIFEST_FILE).is_file()


def engine_summary(directory: Path) -> dict:
    """The engine's facts in display order: method, backend, K, slot profiles, limits, files (each file that is not
    as the manifest records it under "problems"), the verify curve."""
    directory = Path(directory)
    m = read_manifest(directory, check_files=False)
    p = m.profile
    out = {"name": m.name, "backend": m.backend.value, "method": m.method.value,
           "architecture": m.model.architecture, "max_draft_len": p.max_draft_len,
           "slot_profiles": list(p.slots), "max_batch_size": p.max_batch_size, "max_input_len": p.max_input_len,
           "max_seq_len": p.max_seq_len}
    if m.quantization is not None:  # trtllm: the TensorRT-LLM quantization it was planned with
        q = m.quantization
        out["quantization"] = ", ".join([q["quant_algo"]] + [f"{k} {q[k]}" for k in ("group_size", "drafter")
                                                             if q.get(k) is not None])
    else:
        out["weights"] = m.weights.summary()  # the weight format per component (onnx)
    if m.tree:
        out["tree"] = [list(c) for c in m.tree]
    if m.redrafter:  # the beam search built into a ReDrafter engine
        r = m.redrafter
        out["redrafter"] = (f"{r['num_beams']} beams x {r['draft_len_per_beam']} draft tokens, "
                            f"{'greedy' if r['greedy_search'] else 'sampled'} beam search")
    if m.backend.value == "onnx":  # the drafters `generate --method` / `draft_method` may ask for
        out["attention"] = ("TreeAttention (trtspec's kernel: every tree slot exact)" if m.attention == "tree" else
                            "GroupQueryAttention" + (" (quantized: chains only)" if m.chains_only else ""))
        if m.matmul_kernel == MATMUL_BLOCK:  # build --native-matmul
            out["products"] = ("BlockMatMul over the blocks (trtspec's kernel: AVX-512 VNNI, else a slower portable "
                               "loop)")
        if m.native_ops:  # what the engine's sessions load from trtspec's compiled library
            out["compiled_ops"] = ", ".join(m.native_ops) + " (trtspec/native, built by scripts/setup.sh)"
        out["methods"] = list(m.runnable_methods())
    out["files"] = {rel: (directory / rel).stat().st_size for rel in sorted(set(m.files.values()))
                    if (directory / rel).is_file()}
    problems = file_problems(directory, m)
    if problems:
        out["problems"] = [f"{rel}: {problem}" for rel, problem in problems.items()] + [
            "rebuild the engine (`trtspec verify ENGINE` checks every file's content hash too)"]
    curve = directory / CURVE_FILE
    if curve.is_file():
        try:
            data = json.loads(curve.read_text())
            data = data["curves"][-1]  # the most recent setting measured
            out["verify_curve"] = {str(s): f"{ms:.2f} ms ({rel:.2f}x)" for s, ms, rel in
                                   zip(data["profiles"], data["step_ms"], data["relative"])}
            out["verify_curve_measured"] = (f"threads {data['threads']}, "
                                            f"{'spinning' if data.get('spin') else 'not spinning'}")
        except (ValueError, KeyError, TypeError, IndexError):
            out["verify_curve"] = "unreadable (measured again on the next start)"
    return out


def file_problems(directory: Path, manifest) -> dict[str, str]:
    """{file: what is wrong with it} for each file the manifest lists that is missing or not at its recorded size
    (the checks opening the engine makes, all of them instead of the first)."""
    problems = {}
    for role, rel in manifest.files.items():
        if not (directory / rel).is_file():
            problems[rel] = f"missing (the manifest's {role} file)"
    for rel, record in manifest.checksums.items():
        path = directory / rel
        if rel in problems:
            continue
        if not path.is_file():
            problems[rel] = "missing (the manifest lists it)"
        elif path.stat().st_size != record["size"]:
            problems[rel] = (f"{path.stat().st_size} bytes, the manifest says {record['size']} (truncated or replaced "
                             "after the build)")
    return dict(sorted(problems.items()))
