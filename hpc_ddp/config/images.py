"""A container image as the login node can see it, for the submit-time checks of
:mod:`hpc_ddp.config.preflight`: what a Charliecloud directory image holds.

Charliecloud's images are plain directories (or SquashFS files) on a shared file system, so
the login node can look inside one without running anything: whether ``env.container.python``
is there, and whether each bind's destination is a directory of the image (``ch-run`` 0.31 binds
only onto directories a read-only image already has). An Apptainer ``.sif`` file or a pyxis
image name cannot be opened without their runtimes, so they are not looked into.

Looks at files only; runs nothing (standard library).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from hpc_ddp.config.loginnode import LoginNode
from hpc_ddp.config.model import ContainerConfig
from hpc_ddp.frozen import dataclass

__all__ = ["ImageFinding", "check_charliecloud_image"]

_WRITABLE = ("-w", "--write")
"""ch-run options that mount the image read-write: then a missing bind destination is made."""
_FALLBACK_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


@dataclass(frozen=True)
class ImageFinding:
    """Something found about the image: an ``error`` (the job would fail on its nodes) or a
    warning (it may, or may not)."""

    key: str
    text: str
    error: bool


def check_charliecloud_image(
    container: ContainerConfig, node: LoginNode, workdir: Path, path_may_change: bool
) -> Iterator[ImageFinding]:
    """What the login node can tell about a Charliecloud job's image and ``ch-run``.

    ``workdir`` is the job's working directory (where it is submitted from, unless
    ``slurm.extra.chdir``): ch-run starts each task there (``--cd``), so the container must
    show it. ``path_may_change``: ``env.modules`` or ``env.setup`` may change ``PATH`` before
    the tasks start, so a ``python`` looked up on it is only a warning when not found.
    """
    if container.ch_run_shows(str(workdir)) is False:
        yield ImageFinding(
            "env.container.binds",
            f"the job's working directory {str(workdir)!r} (where it is submitted from) is not "
            "visible inside the charliecloud container, where each task starts in it "
            "(ch-run --cd): ch-run shows only /tmp and binds that keep their path (here: "
            f"{', '.join(container.binds) or 'none'}). HINT: add a directory that holds it "
            "to env.container.binds, or submit from inside one",
            error=True,
        )
    if _which("ch-run", node.path) is None:
        yield ImageFinding(
            "env.container.runtime",
            "charliecloud: ch-run is not on PATH on this machine; the compute nodes must have "
            "it. HINT: load what provides it in env.modules or env.setup (`module load "
            "charliecloud` on many sites; Debian: the charliecloud-runtime package)",
            error=False,
        )
    image = container.image
    if "/" not in image:
        return  # an image name in ch-image's storage directory: nothing to look at from here
    root = node.cwd / image
    if not root.exists():
        yield ImageFinding(
            "env.container.image",
            f"{image!r} does not exist on this machine ({root}); it may exist only on the "
            "compute nodes. HINT: give the image directory's path as the nodes see it (a "
            "relative one starts from the directory you submit from)",
            error=False,
        )
        return
    if not root.is_dir():
        return  # a SquashFS file: ch-run mounts it; nothing to look into without it
    yield from _check_python(container, root, node.path, path_may_change)
    if not any(option in _WRITABLE for option in container.options):
        yield from _check_bind_targets(container, root)


def _check_python(
    container: ContainerConfig, root: Path, path: str, path_may_change: bool
) -> Iterator[ImageFinding]:
    python = container.python
    if python.startswith("/"):
        if not os.path.lexists(root / python.lstrip("/")):
            yield ImageFinding(
                "env.container.python",
                f"{python!r} is not in the image {str(root)!r}. HINT: give the interpreter's "
                "path inside the image (the one with torch and hpc-ddp installed, e.g. "
                f"/opt/venv/bin/python; look with `ls {root}/usr/bin/python3*`)",
                error=True,
            )
        return
    # ch-run passes the job's PATH through: the name is looked up in the image along it.
    dirs = [d for d in path.split(os.pathsep) if d.startswith("/")] + list(_FALLBACK_PATH)
    if any(os.path.lexists(root / d.lstrip("/") / python) for d in dirs):
        return
    yield ImageFinding(
        "env.container.python",
        f"{python!r} is not found in the image {str(root)!r} along the job's PATH (searched "
        f"{len(dirs)} directories). HINT: give the interpreter's absolute path inside the image, "
        "e.g. /opt/venv/bin/python",
        error=not path_may_change,
    )


def _check_bind_targets(container: ContainerConfig, root: Path) -> Iterator[ImageFinding]:
    for bind in container.binds:
        src, _, dst = bind.partition(":")
        target = dst or src
        if not target.startswith("/") or (root / target.lstrip("/")).is_dir():
            continue
        yield ImageFinding(
            "env.container.binds",
            f"{bind!r}: the image {str(root)!r} has no directory {target}, and ch-run binds "
            "only onto directories a read-only image already has. HINT: make it in the image "
            f"once (`mkdir -p {root}{target}`), or bind a directory the image has",
            error=True,
        )


def _which(program: str, path: str) -> str | None:
    import shutil  # only for a container job: not on every submit

    return shutil.which(program, path=path)
