"""Checkpoints on the node side: the file's format and digests, the background writer, and the
session's cross-rank checkpointer. The listing a login node reads lives in :mod:`hpc_ddp.rundir`.
"""
