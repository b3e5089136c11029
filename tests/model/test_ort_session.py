"""The ONNX Runtime session options: numpy's smallest-subnormal warning, which flush-to-zero sets off, is silenced
and no other warning is."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_flush_to_zero_sets_off_no_numpy_subnormal_warning_and_other_warnings_still_show(tmp_path):
    """A fresh process with every UserWarning an error: once a session exists, flush-to-zero is on (so numpy's
    limits of a float type it has not described yet come with "smallest subnormal ... is zero"); what numpy does
    then (np.polyfit, np.finfo of every float type, scipy's import) raises nothing, while another UserWarning
    still does."""
    script = textwrap.dedent(f"""
        import warnings
        import numpy as np
        from onnx import TensorProto, helper, save
        from trtspec.model.ort_session import ort_session

        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
        save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), {str(tmp_path / 'g.onnx')!r})
        ort_session({str(tmp_path / 'g.onnx')!r}, threads=1)
        assert np.float32(1e-45) == 0, "flush-to-zero is not on: this test shows nothing"
        np.polyfit([0.0, 1.0, 2.0], [1.0, 2.0, 3.5], 1)
        for t in (np.float16, np.float32, np.float64, np.longdouble):
            str(np.finfo(t))
        import scipy.linalg  # noqa: F401
        try:
            warnings.warn("another warning", UserWarning)
        except UserWarning:
            print("other warnings show")
    """)
    result = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", script], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "other warnings show" and "subnormal" not in result.stderr
