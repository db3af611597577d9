"""Checkpoints on the node side: the file's format (``format``), its digests (``digest``), the
snapshot into host buffers (``snapshot``), the durable background writer (``writer``) and the
session's cross-rank checkpointer (``checkpointer``). The listing both sides read, without
torch, lives in :mod:`hpc_ddp.rundir.checkpoints`.
"""
