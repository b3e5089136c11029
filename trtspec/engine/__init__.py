"""Engines: the manifest (single source of truth after build), profiles, and the builders per backend."""
