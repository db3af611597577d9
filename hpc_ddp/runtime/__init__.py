"""The rank's own library: SLURM_* to dist env, the process group, the stop flag, the handoff,
the resumable sampler, metrics and progress. The session over them is :mod:`hpc_ddp.sessions`.
"""
