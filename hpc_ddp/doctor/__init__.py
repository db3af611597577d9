"""``hpc-ddp doctor``: the exam each task runs, and the judgement over what the tasks saw."""
