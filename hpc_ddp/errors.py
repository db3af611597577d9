"""The one exception tree of hpc-ddp.

Every error a user can cause derives from :class:`HpcDdpError`; the CLI maps the tree to exit
codes (2 for usage and config errors, 1 for failed submissions and runtime failures) and prints
the message, never a traceback. Messages name the bad value and end with a ``HINT:`` that says
how to fix it.

    HpcDdpError
    ├── ConfigError                 a job, site or sweep file is wrong (exit 2)
    │   └── OverrideError           a KEY=VALUE on the command line is wrong
    ├── RenderError                 a template could not be rendered (exit 2)
    ├── BackendError                asking a backend (its scheduler) failed (exit 1)
    │   └── SlurmError              talking to Slurm failed
    │       ├── SubmissionError     sbatch refused or printed something unparsable
    │       └── SlurmUnavailableError  no Slurm command on PATH / controller unreachable
    ├── DistEnvError                the task's environment is inconsistent (exit 1)
    ├── PeerError                   another rank failed where this one waited for it (exit 1)
    ├── CheckpointError             no loadable checkpoint where one was required
    ├── RunDirError                 a run directory is missing or damaged
    │   ├── RunsDirError            --runs-dir is not a usable directory (exit 2)
    │   └── TargetError             a target is no run dir, sweep task or job id (exit 2)
    ├── RunFailedError              a run (or sweep) waited on ended without completing
    ├── WaitTimeoutError            a wait ran out of time while the run went on
    └── DevClusterError             the local dev cluster could not be set up
"""

from __future__ import annotations


class HpcDdpError(Exception):
    """Base of every error hpc-ddp raises on purpose."""

    exit_code: int = 1


class ConfigError(HpcDdpError):
    """A job, site-profile or sweep file (or an override) is invalid."""

    exit_code = 2


class OverrideError(ConfigError):
    """A ``KEY=VALUE`` override from the command line is malformed or names no key."""


class RenderError(HpcDdpError):
    """The sbatch template could not be found or rendered."""

    exit_code = 2


class BackendError(HpcDdpError):
    """A backend could not be asked or refused what it was asked (start, states, cancel): the
    base that code working with any backend catches; each backend raises its own subclass."""


class SlurmError(BackendError):
    """A Slurm command failed."""


class SubmissionError(SlurmError):
    """``sbatch`` refused the job or printed output that is not a job id."""


class SlurmUnavailableError(SlurmError):
    """Slurm's commands are not on PATH or the controller does not answer."""


class DistEnvError(HpcDdpError):
    """The distributed environment of a task is missing values or contradicts itself."""


class PeerError(HpcDdpError):
    """Another rank failed (or vanished) while this one waited for it outside a collective:
    the message names that rank and its error."""


class CheckpointError(HpcDdpError):
    """A checkpoint that was required could not be found or loaded."""


class RunDirError(HpcDdpError):
    """A run directory is missing, or its manifest is unreadable."""


class RunsDirError(RunDirError):
    """The directory that holds the runs (``--runs-dir``) is a file, unreadable or unwritable."""

    exit_code = 2


class RunFailedError(HpcDdpError):
    """A run (or a sweep) that was waited on ended without completing: FAILED, CANCELLED,
    TIMEOUT, INCOMPLETE, ... (``hpc_ddp.Job.wait``, ``hpc_ddp.Sweep.wait``).

    ``status`` is the run's :class:`~hpc_ddp.api.status.RunStatus` (a sweep's
    :class:`~hpc_ddp.api.status.SweepStatus`) as it ended, and ``reasons`` the lines
    ``hpc-ddp status`` prints under its table for it: the rank that failed first, and why.
    """

    def __init__(
        self, message: str, *, status: object = None, reasons: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reasons = reasons


class WaitTimeoutError(HpcDdpError):
    """A wait for a run (or a sweep) ran out of time; the run itself goes on.

    ``status`` is where it stood at the last look.
    """

    def __init__(self, message: str, *, status: object = None) -> None:
        super().__init__(message)
        self.status = status


class DevClusterError(HpcDdpError):
    """The local development Slurm cluster could not be brought up or down."""


class TargetError(RunDirError):
    """A command-line target names no run directory, sweep task or valid job id."""

    exit_code = 2
