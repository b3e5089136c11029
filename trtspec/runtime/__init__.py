"""Engines and the speculative loop that drives them."""
