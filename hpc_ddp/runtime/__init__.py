"""On each task: SLURM_* to dist env, process group, stop flag, checkpoints, requeue, the session
API.
"""
