"""Where a run runs: one interface with a login face and a node face, one package per backend
(:mod:`hpc_ddp.backends.slurm`, :mod:`hpc_ddp.backends.local`), each named by one row of the
catalog (:mod:`hpc_ddp.backends.catalog`).
"""
