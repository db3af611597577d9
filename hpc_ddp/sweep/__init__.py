"""Sweeps: expansion into points (pure), one job array per sweep, and the results table."""
