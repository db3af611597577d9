"""A real container image for the dev cluster: a Debian root filesystem that Charliecloud's
``ch-run`` runs as a directory image, with its own Python, a CPU build of torch and hpc-ddp
installed from this checkout. Nothing of the host's interpreter is bound in.

The image is built in three layers, each cached under the dev cluster's state directory and
named by a hash of its inputs, each a hard-linked copy of the one below (no space, a second),
so a rebuild costs only what changed:

* ``base-<hash>``: ``debootstrap`` of Debian from its mirror and a venv at ``/opt/venv`` with
  the CPU build of torch from the local wheel directory pip is pointed at (``PIP_FIND_LINKS``):
  one to three minutes, 1.2 GB. Its hash covers :class:`ImageSpec`.
* ``deps-<hash>``: hpc-ddp's dependencies and build requirements as ``pyproject.toml`` lists
  them, from the Python registry, but torch (in the base) and torchvision (see
  :attr:`ImageSpec.skip`): seconds.
* ``hpc-ddp-<hash>``: hpc-ddp built from this checkout's sources (``pip install --no-deps``):
  seconds. Its hash covers every source file.

Builds go into a temporary directory that is renamed into place only when complete, under a
lock, so a half-built image is never used and two builders do not collide.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from hpc_ddp.devcluster import packages
from hpc_ddp.errors import DevClusterError

IMAGE_PYTHON = "/opt/venv/bin/python"
"""The interpreter inside the image that runs ``-m hpc_ddp``."""
_HOST_CERTS = "/mnt/hostcerts"
"""Where a build binds the host's CA directory (this machine reaches the registries through a
TLS proxy whose CA only the host's bundle holds)."""
_WHEELS = "/mnt/wheels"
_SOURCE = "/opt/src/hpc-ddp"
_KEEP = {"base": 1, "deps": 2, "hpc-ddp": 3}
"""How many layers of each kind to keep, the newest (jobs of an older checkout may still use
theirs; an image keeps its data when the layer below it is removed: hard links)."""


@dataclass(frozen=True)
class ImageSpec:
    """The inputs of the base layer. ``mount_points`` are made empty in the image: Charliecloud
    0.31 binds a host directory (``ch-run -b DIR``) only onto a directory that exists in a
    read-only image, so the top directories that run dirs live under must be there."""

    suite: str = "bookworm"
    mirror: str = "http://deb.debian.org/debian"
    debian_packages: tuple[str, ...] = ("python3", "python3-venv")
    local_requirements: tuple[str, ...] = ("torch==2.13.0",)
    """Installed only from the local wheel directory (``PIP_FIND_LINKS``), never from the
    registry: there lies the CPU build of torch 2.13.0 for Python 3.11, while the registry's
    torch is a CUDA build of several GB."""
    python_requirements: tuple[str, ...] = ("numpy==2.4.6",)
    """From the registry into the base. numpy is the host venv's, so that RNG state saved with
    a checkpoint reads back the same on either side."""
    skip: tuple[str, ...] = ("torch", "torchvision")
    """hpc-ddp dependencies not installed from the registry: torch is in the base; the
    registry's torchvision is built for its CUDA torch and fails to import beside the CPU one
    (``operator torchvision::nms does not exist``). Only torchvision models and datasets need
    it: the MLP on synthetic data does not import it."""
    mount_points: tuple[str, ...] = ("/work", "/scratch", "/var/lib/hpc-ddp")


@dataclass(frozen=True)
class Image:
    """A built image: its directory, and what building it cost this time."""

    path: Path
    built: tuple[str, ...]
    """The layers built now (``base``, ``hpc-ddp``); empty when both came from the cache."""
    seconds: float


def images_dir(state_dir: Path) -> Path:
    """Where the dev cluster in ``state_dir`` keeps its images."""
    return state_dir / "images"


def source_root() -> Path:
    """The checkout this hpc-ddp was imported from (it holds ``pyproject.toml``)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise DevClusterError(
            f"hpc-ddp at {root} is not a source checkout (no pyproject.toml). "
            "HINT: build the image from a clone of hpc-ddp (pip install -e .)."
        )
    return root


def source_files(root: Path) -> list[Path]:
    """The files that make up hpc-ddp's distribution, relative to ``root``, sorted."""
    found = [Path("pyproject.toml"), Path("README.md")]
    for top in ("hpc_ddp", "slurm_templates"):
        found += [
            p.relative_to(root)
            for p in (root / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    return sorted(found)


def dependencies(pyproject: str, skip: Sequence[str]) -> tuple[str, ...]:
    """hpc-ddp's requirements and build requirements in ``pyproject`` (the text of
    ``pyproject.toml``) but those whose project name is in ``skip``."""
    import tomllib  # Python 3.11+; the dev cluster's machines have it

    names = {_canonical(s) for s in skip}
    data = tomllib.loads(pyproject)
    # What builds hpc-ddp too (setuptools): then each source change builds without fetching it.
    found = [
        *data.get("project", {}).get("dependencies", []),
        *data.get("build-system", {}).get("requires", []),
    ]
    return tuple(r for r in found if _canonical(_project_name(r)) not in names)


def _project_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
    return match[0] if match else requirement


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def base_key(spec: ImageSpec) -> str:
    """The hash naming the base layer built from ``spec``."""
    return _digest(json.dumps(asdict(spec), sort_keys=True).encode())


def deps_key(base: str, requirements: Sequence[str]) -> str:
    """The hash naming the dependency layer: the base's hash and the requirements."""
    return _digest(json.dumps([base, list(requirements)]).encode())


def image_key(below: str, sources: Mapping[str, bytes]) -> str:
    """The hash naming the hpc-ddp layer: the hash of the layer below and every source file's
    path and bytes."""
    h = hashlib.sha256(below.encode())
    for name in sorted(sources):
        h.update(f"\0{name}\0{len(sources[name])}\0".encode())
        h.update(sources[name])
    return h.hexdigest()[:16]


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def build(state_dir: Path, env: Mapping[str, str], spec: ImageSpec | None = None) -> Image:
    """Build (or find in the cache) the image for this checkout; return its directory.

    Installs ``debootstrap`` and ``charliecloud-runtime`` with apt-get when missing. Needs root
    (debootstrap) and the Debian mirror and Python registry this machine reaches.
    """
    t0 = time.monotonic()
    spec = spec or ImageSpec()
    packages.ensure([packages.DEBOOTSTRAP, packages.CHARLIECLOUD], env)
    cache = images_dir(state_dir)
    cache.mkdir(parents=True, exist_ok=True)
    root = source_root()
    sources = {str(p): (root / p).read_bytes() for p in source_files(root)}
    requirements = dependencies(sources["pyproject.toml"].decode(), spec.skip)
    base = cache / f"base-{base_key(spec)}"
    deps = cache / f"deps-{deps_key(base.name, requirements)}"
    final = cache / f"hpc-ddp-{image_key(deps.name, sources)}"
    layers: list[tuple[Path, Callable[[Path], None]]] = [
        (base, lambda tmp: _build_base(tmp, spec, env)),
        (deps, lambda tmp: _build_deps(tmp, base, requirements, env)),
        (final, lambda tmp: _build_hpc_ddp(tmp, deps, sources, env)),
    ]
    built: list[str] = []
    with _lock(cache):
        for path, make in layers:
            if not path.is_dir():
                _build_layer(path, make)
                built.append(path.name.rpartition("-")[0])
            os.utime(path)  # used now: the newest survive pruning
        _prune(cache)
    return Image(path=final, built=tuple(built), seconds=time.monotonic() - t0)


@contextlib.contextmanager
def _lock(cache: Path) -> Iterator[None]:
    with (cache / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _build_layer(final: Path, make: Callable[[Path], None]) -> None:
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)  # left by a build that was killed
    try:
        make(tmp)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _build_base(tmp: Path, spec: ImageSpec, env: Mapping[str, str]) -> None:
    _run(
        [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(spec.debian_packages)}",
            spec.suite,
            str(tmp),
            spec.mirror,
        ],
        env,
        "check that the Debian mirror is reachable (apt-get update)",
    )
    # ch-run binds the host's /etc/hosts (the node names) only over a file the image has.
    (tmp / "etc" / "hosts").touch()
    for point in (*spec.mount_points, _HOST_CERTS, _WHEELS):
        (tmp / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for p in (tmp / cache).glob("*"):
            if p.is_file():
                p.unlink()
    _ch_run(tmp, ["/usr/bin/python3", "-m", "venv", "/opt/venv"], env)
    if spec.local_requirements:
        if not _wheel_dir(env):
            raise DevClusterError(
                f"no local wheel directory for {', '.join(spec.local_requirements)}. "
                "HINT: point PIP_FIND_LINKS at the directory holding the CPU build of torch."
            )
        # The local wheel alone first (its dependencies are not in the wheel directory), so
        # that the second install finds it satisfied and takes only the rest from the registry.
        _pip(tmp, ["--no-index", "--no-deps", *spec.local_requirements], env)
    _pip(tmp, [*spec.local_requirements, *spec.python_requirements], env)


def _build_deps(tmp: Path, base: Path, requirements: Sequence[str], env: Mapping[str, str]) -> None:
    _run(["cp", "-al", str(base), str(tmp)], env, f"check the disk under {base.parent}")
    if requirements:
        _pip(tmp, list(requirements), env)


def _build_hpc_ddp(
    tmp: Path, deps: Path, sources: Mapping[str, bytes], env: Mapping[str, str]
) -> None:
    # Hard links: the copy costs no space and a second; pip only adds files to it.
    _run(["cp", "-al", str(deps), str(tmp)], env, f"check the disk under {deps.parent}")
    src = tmp / _SOURCE.lstrip("/")
    for name, data in sources.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    _pip(tmp, ["--no-deps", "--no-build-isolation", _SOURCE], env)
    shutil.rmtree(src)
    (tmp / "opt" / "hpc-ddp-image.json").write_text(
        json.dumps({"below": deps.name, "sources": sorted(sources)}, indent=1) + "\n"
    )


def _pip(image: Path, args: list[str], env: Mapping[str, str]) -> None:
    pip = f"{Path(IMAGE_PYTHON).parent}/pip"
    _ch_run(image, [pip, "install", "--no-cache-dir", *args], env, pip=True)


def _ch_run(image: Path, argv: list[str], env: Mapping[str, str], *, pip: bool = False) -> None:
    """Run ``argv`` in ``image`` (writable) with a clean environment, not the host's."""
    opts = ["-w"]
    clean = {
        "USER": env.get("USER", "root"),
        "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
    }
    if pip:
        opts += _pip_binds(env)
        clean |= {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_DEFAULT_TIMEOUT": "180"}
    _run(["ch-run", *opts, str(image), "--", *argv], clean, "see the output above")


def _pip_binds(env: Mapping[str, str]) -> list[str]:
    """ch-run options that give pip in the image the host's CA bundle and wheel directory."""
    opts = []
    bundle = Path(
        env.get("PIP_CERT")
        or env.get("SSL_CERT_FILE")
        or env.get("REQUESTS_CA_BUNDLE")
        or "/etc/ssl/certs/ca-certificates.crt"
    )
    if bundle.is_file():
        opts += [
            "-b",
            f"{bundle.parent}:{_HOST_CERTS}",
            f"--set-env=PIP_CERT={_HOST_CERTS}/{bundle.name}",
        ]
    wheels = _wheel_dir(env)
    if wheels:
        opts += ["-b", f"{wheels}:{_WHEELS}", f"--set-env=PIP_FIND_LINKS={_WHEELS}"]
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL"):
        if env.get(name, "").startswith(("http://", "https://")):
            opts.append(f"--set-env={name}={env[name]}")
    return opts


def _wheel_dir(env: Mapping[str, str]) -> str | None:
    """The first local directory in ``PIP_FIND_LINKS`` (one is enough: the CPU torch)."""
    return next((p for p in env.get("PIP_FIND_LINKS", "").split() if Path(p).is_dir()), None)


def _run(argv: list[str], env: Mapping[str, str], hint: str) -> None:
    done = subprocess.run(
        argv, env=dict(env), stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-20:])
        raise DevClusterError(
            f"`{' '.join(argv[:6])} ...` exited {done.returncode}:\n{tail}\nHINT: {hint}."
        )


def _prune(cache: Path) -> None:
    for kind, keep in _KEEP.items():
        layers = sorted(cache.glob(f"{kind}-*"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in layers[keep:]:
            shutil.rmtree(old, ignore_errors=True)
