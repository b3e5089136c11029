"""Speculative decoding maths shared by every backend: trees, sampling and acceptance rules, proposers."""
