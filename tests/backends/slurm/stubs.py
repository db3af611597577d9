"""Stub container runtimes for tests that run a rendered script under real bash."""

from __future__ import annotations


def apptainer_stub(argv_file: str) -> str:
    """A stub ``apptainer``: it writes its argv, NUL-separated, to ``argv_file`` (a shell word,
    e.g. ``"$STUB_OUT/apptainer.argv"``), then runs what the image would run: from ``exec
    [OPTIONS] IMAGE COMMAND...`` it execs ``COMMAND...`` on the host."""
    return f"""#!/bin/sh
printf '%s\\0' "$@" > {argv_file}
[ "$1" = exec ] && shift
while [ $# -gt 0 ]; do
    case "$1" in --bind) shift 2 ;; -*) shift ;; *) shift; break ;; esac
done
exec "$@"
"""
