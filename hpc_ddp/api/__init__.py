"""The login side as a Python API: what the ``hpc-ddp`` verbs do, for scripts and notebooks.

``hpc_ddp.submit()``, ``resume()``, ``submit_sweep()`` and ``runs()`` return :class:`Job`,
:class:`Sweep`, :class:`RunStatus` and :class:`SweepStatus` objects (all exported by
``hpc_ddp``, loaded on first use); the CLI verbs parse their arguments, call the same
functions and print what they return, so there is one implementation of each. Modules:
``job`` (one run), ``sweep`` (a job array of points, and its results), ``results`` (the
results table and plot), ``status`` (what ``hpc-ddp status`` shows, typed, and waiting for it
to settle), ``cancel`` (what a target cancels, and whether it is provably that target's),
``logs``, ``doctor`` (the checks as a job, and their findings), ``targets`` (which runs a
command-line target means) and ``arguments`` (a path argument, the overrides). Never imports
torch, torchvision or submitit.
"""
