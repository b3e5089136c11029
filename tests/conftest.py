"""Shared test setup."""

import os

import torch

# Tiny test models gain nothing from intra-op threads, and spinning OpenMP workers slow everything down
# by an order of magnitude when another process holds the second core.
torch.set_num_threads(1)

# The suite shares two cores between pytest, tritonserver and its model stubs: a shared machine, where ONNX Runtime's
# spinning workers (trtspec's default for dedicated cores) would take the cores the others need. Tests that are
# about spinning set it themselves.
os.environ.setdefault("TRTSPEC_ORT_SPIN", "0")
