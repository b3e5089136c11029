"""Drafter training and initialisation: Medusa heads and EAGLE drafts for any base model."""
