"""The session: the one API user scripts and the built-in trainer share (``session``), and its
evaluation loader (``evaluation``). It sits above the rank's library (:mod:`hpc_ddp.runtime`),
the checkpoints (:mod:`hpc_ddp.checkpoint`) and the fault model (:mod:`hpc_ddp.fault`), and
brings them together for one process of a run. The package is ``sessions`` because
``hpc_ddp.session`` is the public function that opens one.
"""
