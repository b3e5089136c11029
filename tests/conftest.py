"""Shared test setup."""

import torch

# Tiny test models gain nothing from intra-op threads, and spinning OpenMP workers slow everything down
# by an order of magnitude when another process holds the second core.
torch.set_num_threads(1)
