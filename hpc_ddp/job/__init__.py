"""What runs inside the job: each task's main (``hpc-ddp run RUN_DIR``), over the runtime."""
