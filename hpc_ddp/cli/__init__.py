"""The ``hpc-ddp`` command line: ``main(argv)`` over one small handler per sub-command."""
