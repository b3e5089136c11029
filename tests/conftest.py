"""Shared test setup."""

import os
import shutil

import pytest
import torch

# Tiny test models gain nothing from intra-op threads, and spinning OpenMP workers slow everything down
# by an order of magnitude when another process holds the second core.
torch.set_num_threads(1)

# The suite shares two cores between pytest, tritonserver and its model stubs: a shared machine, where ONNX Runtime's
# spinning workers (trtspec's default for dedicated cores) would take the cores the others need. Tests that are
# about spinning set it themselves.
os.environ.setdefault("TRTSPEC_ORT_SPIN", "0")


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory, request):
    """A folder a module's tests share, removed when the module ends. Real-model modules keep SmolLM2 checkpoints and
    engines there (several GB): pytest removes a passing test's own tmp_path at once (pyproject's
    tmp_path_retention_policy), but folders from tmp_path_factory only when the whole session has passed."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)
