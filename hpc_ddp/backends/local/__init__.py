"""Running a job without Slurm: N local processes (submitit's local executor), and cancelling them
only while they are provably that run's.
"""
