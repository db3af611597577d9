"""The Slurm side: sbatch rendering (pure), node lists, the Slurm client (the one place that runs
Slurm's commands) and submission.
"""
