"""Lemon-node memory: the nodes blamed for faults across runs and jobs, kept in the user's state
directory, so that a node that killed last night's jobs is left out of the next one
(:mod:`hpc_ddp.lemons.record`: the entries and what they mean, pure;
:mod:`hpc_ddp.lemons.store`: the files).
"""
