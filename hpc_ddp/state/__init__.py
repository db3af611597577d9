"""What a run is, from its witnesses (Slurm, the ledger, the logs): pure types and the verdict
shown by status and results.
"""
