"""Benchmarks: commands that measure side by side in one run and print the figures."""
