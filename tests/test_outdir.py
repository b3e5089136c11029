"""Atomic outputs under signals: the temporary sibling goes on SIGTERM / SIGHUP (the process still dies of the
signal), and the next writer removes siblings whose process is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from trtspec.outdir import atomic_output_dir, atomic_output_file, remove_stale_siblings

WRITER = """
import sys, time
from pathlib import Path
from trtspec.outdir import atomic_output_dir, atomic_output_file
out = Path(sys.argv[1])
context = atomic_output_dir(out) if sys.argv[2] == "dir" else atomic_output_file(out)
with context as tmp:
    (tmp / "weights.bin" if sys.argv[2] == "dir" else tmp).write_bytes(b"x" * 1000)
    print("writing", flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("kind", ["dir", "file"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_removes_the_temporary_sibling_and_still_ends_the_process(tmp_path, kind, sig):
    out = tmp_path / "engine"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(out), kind], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    assert [p.name for p in tmp_path.iterdir()][0].startswith(f".engine.tmp-{proc.pid}-")
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == -sig  # died of the signal, as without trtspec's handler (shell: 128 + N)
    assert list(tmp_path.iterdir()) == []


def test_stale_siblings_of_gone_processes_are_removed_by_the_next_writer(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    out = tmp_path / "engine"
    stale_dir, stale_file = tmp_path / f".engine.tmp-{dead}-abc", tmp_path / f".engine.old-{dead}-def"
    stale_dir.mkdir()
    (stale_dir / "weights.bin").write_bytes(b"x")
    stale_file.write_bytes(b"x")
    live = tmp_path / f".engine.tmp-{os.getpid()}-ghi"  # a writer still running: kept
    live.mkdir()
    legacy = tmp_path / ".engine.tmp-k2j4l5m6"  # no process id: not a trtspec writer's, left alone
    legacy.mkdir()
    other = tmp_path / f".other.tmp-{dead}-x"  # another output's: not ours to touch
    other.mkdir()
    with atomic_output_dir(out) as tmp:
        (tmp / "weights.bin").write_bytes(b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["engine", live.name, legacy.name, other.name])
    stale = tmp_path / f".store.ds.tmp-{dead}-zz"
    stale.write_bytes(b"x")
    with atomic_output_file(tmp_path / "store.ds") as tmp:
        tmp.write_bytes(b"data")
    assert not stale.exists() and (tmp_path / "store.ds").read_bytes() == b"data"
    assert remove_stale_siblings(tmp_path / "missing" / "x") == []
