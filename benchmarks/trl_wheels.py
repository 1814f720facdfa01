"""TRL for the GPU machine, which has no TRL and no package registry: wheels fetched here, installed there.

    python3 benchmarks/trl_wheels.py download             # here (registry reachable): fills .wheels/trl/
    eval "$(sh .wheels/trl/install.sh)"                   # there (carry: [".wheels/trl"]): installs, exports PYTHONPATH

``download`` fetches :data:`PINS` as Python 3.12 / manylinux x86-64 wheels (``pip download --no-deps
--only-binary=:all:``) into ``--dir`` (default ``.wheels/trl``, git-ignored by ``.gitignore``'s ``.wheels/``), copies
this file beside them and writes ``install.sh``, so the folder is self-contained (about 3.5 MiB). Only what the GPU
image lacks is pinned: its package list (2026-11) has accelerate, pandas, pyarrow, psutil, xxhash, fsspec,
huggingface-hub 1.33, httpx, requests, peft, but no trl, datasets, dill, multiprocess or liger-kernel.
``--extra NAME==VERSION`` adds more (a cp312 pyarrow is about 55 MiB: past what one device call carries beside the
work tree, so it is not pinned).

``install`` (what ``install.sh`` runs, on the machine's own ``python3``) installs, with ``pip install --no-index
--no-deps --target TARGET`` (default ``/tmp/trl-pkgs``), each shipped distribution that the interpreter does not have
already; one it has, at any version, is left as it is (torch, transformers, the image's pyarrow ... are never upgraded
or shadowed). Where several versions of one distribution are shipped (datasets: 5.2.0, 4.8.5), the newest whose
requirements the interpreter and the other shipped wheels satisfy is taken (datasets 5.2 needs pyarrow >= 24 and
huggingface-hub >= 1.31; 4.8.5 takes pyarrow >= 21 and huggingface-hub < 2). Unmet requirements are printed, then
``import trl, datasets`` and ``from trl import DPOConfig, DPOTrainer`` run with the new path. Messages go to stderr;
the last line on stdout is ``export PYTHONPATH=TARGET:...`` (hence the ``eval``). ``--all`` installs every shipped
wheel whatever is installed, ``--python-version 3.12`` installs for another interpreter (with ``--all``: a test of the
folder on a machine of another Python, imports skipped).

Stdlib only (``packaging`` from the interpreter or from pip's vendored copy), so that it runs before anything is
installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import zipfile

PINS = ("trl==1.16.0", "datasets==5.2.0", "datasets==4.8.5", "dill==0.4.1", "multiprocess==0.70.19",
        "liger-kernel==0.8.5")
"""The shipped wheels: TRL as the test suite uses it (1.16), datasets (the newest, and one for an older pyarrow /
huggingface-hub), datasets' pure-Python needs the GPU image lacks, and Liger-Kernel (for the ``liger`` rows)."""

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
INSTALL_SH = """#!/bin/sh
# Written by benchmarks/trl_wheels.py download. Installs the wheels beside it that this python3 lacks into
# /tmp/trl-pkgs (or the --target given) and prints the PYTHONPATH line to eval:  eval "$(sh .wheels/trl/install.sh)"
here=$(cd "$(dirname "$0")" && pwd)
exec python3 "$here/trl_wheels.py" install --dir "$here" "$@"
"""


def _say(*msg) -> None:
    print(*msg, file=sys.stderr, flush=True)


def _packaging():
    try:
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pragma: no cover - pip's vendored copy
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.version import Version
    return Requirement, Version


def canonical(name: str) -> str:
    """PEP 503 normalised distribution name (``Liger_Kernel`` -> ``liger-kernel``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: str) -> tuple[str, str]:
    """(canonical name, version) from a wheel's file name ``name-version-...whl``."""
    name, version = os.path.basename(path).split("-")[:2]
    return canonical(name), version


def wheel_requires(path: str, python_version: str | None = None) -> list:
    """The wheel's ``Requires-Dist`` that apply without extras (markers evaluated for ``python_version``)."""
    Requirement, _ = _packaging()
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode("utf-8", "replace").splitlines()
    env = {"extra": ""}
    if python_version:
        env.update(python_version=python_version, python_full_version=python_version + ".0")
    out = []
    for line in lines:
        if not line:
            break  # the headers end at the first blank line
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                out.append(req)
    return out


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of every distribution the running interpreter sees (PYTHONPATH included)."""
    import importlib.metadata as md

    found = {}
    for dist in md.distributions():
        name = dist.metadata["Name"]
        if name and canonical(name) not in found:
            found[canonical(name)] = dist.version
    return found


def choose(wheels: list[str], have: dict[str, str], install_all: bool = False,
           python_version: str | None = None) -> tuple[list[str], list[str]]:
    """Which wheels to install, and the notes on what was kept or could not be satisfied.

    Args:
        wheels: wheel paths (several versions of one distribution allowed).
        have: installed distributions, canonical name -> version.
        install_all: install one wheel of every shipped distribution whatever ``have`` holds.
        python_version: the target interpreter's ``X.Y`` for markers (None: the running one's).

    Returns:
        (chosen wheel paths, notes).
    """
    _, Version = _packaging()
    by_name: dict[str, list[str]] = {}
    for w in wheels:
        by_name.setdefault(wheel_name_version(w)[0], []).append(w)
    for ws in by_name.values():
        ws.sort(key=lambda w: Version(wheel_name_version(w)[1]), reverse=True)
    notes, chosen = [], {}
    # what will be importable: the interpreter's own, then the newest shipped version of what it lacks
    env = {} if install_all else dict(have)
    for name, ws in by_name.items():
        if install_all or name not in have:
            env[name] = wheel_name_version(ws[0])[1]
        else:
            notes.append(f"kept the interpreter's {name} {have[name]} (shipped: "
                         f"{', '.join(wheel_name_version(w)[1] for w in ws)})")
    if install_all:
        env = {**have, **env}
    for name, ws in by_name.items():
        if not install_all and name in have:
            continue

        def unmet(w):
            return [str(r) for r in wheel_requires(w, python_version)
                    if canonical(r.name) in env and not r.specifier.contains(env[canonical(r.name)], prereleases=True)]

        pick = next((w for w in ws if not unmet(w)), ws[0])
        chosen[name] = pick
        env[name] = wheel_name_version(pick)[1]
        if len(ws) > 1:
            notes.append(f"{name}: {wheel_name_version(pick)[1]} of {[wheel_name_version(w)[1] for w in ws]}")
    for name, w in chosen.items():  # requirements left unmet or missing, with the final picks
        for r in wheel_requires(w, python_version):
            got = env.get(canonical(r.name))
            if got is None and have:
                notes.append(f"WARNING {name} needs {r}: not installed")
            elif got is not None and not r.specifier.contains(got, prereleases=True):
                notes.append(f"WARNING {name} needs {r}: {got} is there (imports may still work; see the smoke test)")
    return list(chosen.values()), notes


def download(args) -> int:
    os.makedirs(args.dir, exist_ok=True)
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    for spec in PINS + tuple(args.extra):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               args.python_version, "--implementation", "cp", *plats, "-d", args.dir, spec]
        _say("+", " ".join(cmd))
        if subprocess.run(cmd).returncode:
            return 1
    shutil.copy(os.path.abspath(__file__), os.path.join(args.dir, "trl_wheels.py"))
    with open(os.path.join(args.dir, "install.sh"), "w") as f:
        f.write(INSTALL_SH)
    total = sum(os.path.getsize(os.path.join(args.dir, n)) for n in os.listdir(args.dir))
    _say(f"{args.dir}: {len(os.listdir(args.dir))} files, {total / 2**20:.1f} MiB")
    return 0


def install(args) -> int:
    wheels = sorted(os.path.join(args.dir, n) for n in os.listdir(args.dir) if n.endswith(".whl"))
    if not wheels:
        _say(f"no wheels in {args.dir}: run `python3 benchmarks/trl_wheels.py download` where a registry is reachable")
        return 1
    foreign = args.python_version not in (None, f"{sys.version_info[0]}.{sys.version_info[1]}")
    picked, notes = choose(wheels, {} if foreign else installed_versions(), args.all, args.python_version)
    for n in notes:
        _say(n)
    probe = ("import importlib.metadata as m, trl, datasets; from trl import DPOConfig, DPOTrainer; "
             "print(' '.join(f'{d} {m.version(d)}' for d in ('trl', 'datasets', 'transformers', 'torch')))")
    return install_picked(args, picked, foreign, probe)


def install_picked(args, picked: list[str], foreign: bool, probe: str) -> int:
    """``pip install`` the ``picked`` wheel paths into ``args.target`` (for ``args.python_version``'s platform when
    ``foreign``), then, for this interpreter, run the ``probe`` code with the new PYTHONPATH (its last stdout line is
    said). Prints ``export PYTHONPATH=...`` last on stdout and returns 0; 1 when pip or the probe fails."""
    if picked:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--no-cache-dir", "--upgrade", "--disable-pip-version-check", "--target", args.target]
        if foreign:
            cmd += ["--python-version", args.python_version, "--only-binary=:all:", "--implementation", "cp",
                    *[a for p in PLATFORMS for a in ("--platform", p)]]
        _say("+", " ".join(cmd), *(os.path.basename(w) for w in picked))
        if subprocess.run(cmd + picked).returncode:
            return 1
    else:
        _say("nothing to install: the interpreter has every shipped distribution")
    path = os.pathsep.join([args.target] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    if not foreign:
        r = subprocess.run([sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": path},
                           capture_output=True, text=True)
        if r.returncode:
            _say("smoke import FAILED:\n" + r.stderr[-3000:])
            return 1
        _say("smoke import ok:", r.stdout.strip().splitlines()[-1])
    print(f"export PYTHONPATH={path}")
    return 0


def cli(argv, doc: str, download, install, folder: str, target: str, download_help: str) -> int:
    """The ``download`` / ``install`` command line of a wheel folder script (this one, ``deepspeed_wheels.py``):
    ``download(args)`` or ``install(args)`` with ``args.dir`` (default ``folder``), ``args.python_version``,
    ``args.extra`` / ``args.target`` (default ``target``), ``args.all``; returns their exit status."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("download", help=download_help)
    d.add_argument("--dir", default=folder)
    d.add_argument("--python-version", default="3.12")
    d.add_argument("--extra", action="append", default=[], metavar="NAME==VERSION", help="another wheel to ship")
    i = sub.add_parser("install", help="install what this python3 lacks (there, no registry)")
    i.add_argument("--dir", default=folder)
    i.add_argument("--target", default=target)
    i.add_argument("--all", action="store_true", help="install every shipped distribution, installed or not")
    i.add_argument("--python-version", help="install for this X.Y instead of the running interpreter (no imports)")
    args = ap.parse_args(argv)
    return download(args) if args.cmd == "download" else install(args)


def main(argv=None) -> int:
    return cli(argv, __doc__, download, install, ".wheels/trl", "/tmp/trl-pkgs",
               "fetch the pinned wheels (here, with a registry)")


if __name__ == "__main__":
    sys.exit(main())
