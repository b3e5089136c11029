"""The ONNX Runtime session options every CPU-engine graph runs with (no onnx, no torch: the serving path)."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnxruntime

SPIN_ENV = "TRTSPEC_ORT_SPIN"  # "0": intra-op workers sleep between ops (shared hosts); default "1": they spin


def session_options(threads: int | None = None, spin: bool | None = None, *,
                    native_ops: bool = False) -> onnxruntime.SessionOptions:
    """The ONNX Runtime options the engine runs with: all graph optimisations, sequential, `threads` intra-op.

    Workers spin between ops unless `spin` is False (None: TRTSPEC_ORT_SPIN, default "1"), as onnxruntime-genai's
    do: on cores nothing else uses, spinning makes a decode step faster. On a shared machine pass --no-spin
    (TRTSPEC_ORT_SPIN=0): a spinning worker takes the core the thread it waits for needs, and one left spinning
    after its session's run takes a core from the session that runs next: on a loaded machine spinning can double
    a step's time.

    Denormal floats are flushed to zero: attention over a real cache produces them (tiny probabilities), and the
    CPU computes with them slowly. ONNX Runtime does it by setting the CPU's flush-to-zero / denormals-are-zero
    modes on the thread that creates the session, and numpy, asked afterwards for the limits of a float type it has
    not described yet (np.finfo: np.polyfit, scipy's imports, ...), then finds its smallest subnormal to be zero and
    warns, once per type: that warning (QUIET_NUMPY) is silenced, no other."""
    import onnxruntime as ort

    quiet_numpy_subnormal_warning()
    options = ort.SessionOptions()
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads, options.inter_op_num_threads = threads or os.cpu_count() or 1, 1
    spin = effective_spin(spin)
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.add_session_config_entry("session.force_spinning_stop", "0" if spin else "1")
    options.add_session_config_entry("session.set_denormal_as_zero", "1")
    if native_ops:
        from trtspec import native

        native.register(options)
    return options


# numpy's getlimits warning once flush-to-zero is on (above): "The value of the smallest subnormal for <class
# 'numpy.float32'> type is zero."
QUIET_NUMPY = r"The value of the smallest subnormal for <class 'numpy\.\w+'> type is zero\."


def quiet_numpy_subnormal_warning() -> None:
    """Silence numpy's smallest-subnormal UserWarning, and only it, in this process (see session_options)."""
    warnings.filterwarnings("ignore", message=QUIET_NUMPY, category=UserWarning)


def threads_text(threads: int | str | None) -> str:
    """Intra-op threads as a person reads them: 0 or unset (session_options' default) is "all cores"."""
    return "all cores" if threads in (None, "", 0, "0") else str(threads)


def effective_spin(spin: bool | None) -> bool:
    """Whether intra-op workers spin: `spin`, or TRTSPEC_ORT_SPIN (default "1") when None."""
    return os.environ.get(SPIN_ENV, "1") != "0" if spin is None else spin


def ort_session(path: Path, threads: int | None = None, *, native_ops: bool = False) -> onnxruntime.InferenceSession:
    """A CPU session over one graph file with the engine's options (`native_ops`: see session_options)."""
    import onnxruntime as ort

    return ort.InferenceSession(str(path), session_options(threads, native_ops=native_ops),
                                providers=["CPUExecutionProvider"])
