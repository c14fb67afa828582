"""Chaos: fault injection, load generation, experiments and their reports."""
