"""Submitting runs, whatever the backend: prepare, start on Slurm or locally, wait, resume."""
