"""DeepSpeed for the GPU machine, which has no DeepSpeed and no package registry: wheels made here, installed there.

    python3 benchmarks/deepspeed_wheels.py download         # here (registry reachable): fills .wheels/deepspeed/
    eval "$(sh .wheels/deepspeed/install.sh)"               # there (carry: [".wheels/deepspeed"]): installs, exports
    python3 -m pytest tests/test_deepspeed.py               # one GPU: one rank (ZeRO-3 at world size 1); 2+ GPUs: two

``download`` builds DeepSpeed's wheel from its sdist (PyPI has no wheel of it) with ``DS_BUILD_OPS=0 pip wheel
--no-deps --no-cache-dir``: pure Python (``py3-none-any``), no op compiled ahead of time (DeepSpeed compiles an op
with ninja where and when it is first used; ZeRO-2 / ZeRO-3 with a torch optimizer on CUDA use none), and checks
both (:func:`check_deepspeed_wheel`). The build records the build machine's accelerator (``cpu``) and no torch
version in ``deepspeed/git_version_info_installed.py``: DeepSpeed reads them only for ops built ahead of time, of
which there are none; at run time it picks CUDA where ``torch.cuda`` sees a GPU. It then fetches the rest of
:data:`PINS` as Python 3.12 / manylinux x86-64 wheels (``pip download --no-deps --only-binary=:all:``) into
``--dir`` (default ``.wheels/deepspeed``, git-ignored by ``.gitignore``'s ``.wheels/``), copies this file and
``trl_wheels.py`` (the choice of what to install, shared) beside them and writes ``install.sh``: about 5 MiB.

Only what the GPU image lacks is pinned: its package list (2026-11) has torch, transformers, accelerate, peft,
einops, msgpack, ninja, py-cpuinfo, psutil, numpy, packaging, tqdm, nvidia-ml-py and typing-extensions, but no
deepspeed, hjson, pydantic, pydantic-core, annotated-types or typing-inspection. typing-extensions is shipped too:
pydantic 2.14 needs >= 4.16, newer than the image may have.

``install`` (what ``install.sh`` runs, on the machine's own ``python3``) installs with ``pip install --no-index
--no-deps --target TARGET`` (default ``/tmp/ds-pkgs``) each shipped distribution that the interpreter lacks, and one
it has at a version that a shipped wheel's requirement rules out where the shipped one meets it (:func:`stale`:
typing-extensions older than pydantic's bound); everything else the interpreter has is left as it is (torch,
transformers, numpy ... are never upgraded or shadowed). It prints what it kept and any unmet requirement, then
imports ``deepspeed`` and ``pydantic`` with the new path and fails (non-zero) if that fails. Messages go to stderr;
the last line on stdout is ``export PYTHONPATH=TARGET:...`` (hence the ``eval``). ``--all`` installs every shipped
wheel; ``--python-version 3.12`` installs for another interpreter (with ``--all``: a test of the folder on a
machine of another Python, imports skipped).

Stdlib only (``packaging`` from the interpreter or pip's vendored copy), so that it runs before anything is
installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # trl_wheels.py: beside this file, here and there
import trl_wheels  # noqa: E402
from trl_wheels import (PLATFORMS, _say, canonical, choose, installed_versions, wheel_name_version,  # noqa: E402
                        wheel_requires)

DEEPSPEED = "deepspeed==0.19.8"
"""Built here from its sdist (the version the tests were measured with)."""
PINS = ("hjson==3.1.0", "pydantic==2.14.4", "pydantic-core==2.50.5", "annotated-types==0.8.0",
        "typing-inspection==0.4.5", "typing-extensions==4.16.0")
"""Fetched as wheels: DeepSpeed's requirements that the GPU image lacks (pydantic's exact pydantic-core), and a
typing-extensions new enough for that pydantic."""

INSTALL_SH = """#!/bin/sh
# Written by benchmarks/deepspeed_wheels.py download. Installs the wheels beside it that this python3 lacks into
# /tmp/ds-pkgs (or the --target given) and prints the PYTHONPATH line to eval:
#   eval "$(sh .wheels/deepspeed/install.sh)"
here=$(cd "$(dirname "$0")" && pwd)
exec python3 "$here/deepspeed_wheels.py" install --dir "$here" "$@"
"""


def check_deepspeed_wheel(path: str) -> list[str]:
    """What is wrong with a DeepSpeed wheel for the GPU machine (empty: nothing): it must be pure Python
    (``py3-none-any``: installable on cp312 manylinux x86-64) and hold no op built ahead of time (``installed_ops``
    all False in ``deepspeed/git_version_info_installed.py``, as ``DS_BUILD_OPS=0`` leaves it)."""
    problems = []
    tags = os.path.basename(path)[:-len(".whl")].split("-")[-3:]
    if tags != ["py3", "none", "any"]:
        problems.append(f"{os.path.basename(path)}: tags {'-'.join(tags)}, not py3-none-any")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        info = "deepspeed/git_version_info_installed.py"
        if info not in names:
            problems.append(f"no {info} in the wheel")
        else:
            text = z.read(info).decode()
            ops = re.search(r"installed_ops\s*=\s*(\{[^}]*\})", text)
            built = [k for k, v in re.findall(r"'(\w+)':\s*(True|False)", ops.group(1)) if v == "True"] if ops \
                else None
            if built is None:
                problems.append(f"no installed_ops in {info}")
            elif built:
                problems.append(f"ops built ahead of time (not DS_BUILD_OPS=0): {built}")
        compiled = [n for n in names if n.endswith((".so", ".pyd"))]
        if compiled:
            problems.append(f"compiled files in the wheel: {compiled[:5]}")
    return problems


def stale(wheels: list[str], have: dict[str, str], python_version: str | None = None) -> dict[str, str]:
    """``have`` less the distributions to install over: those installed at a version that a shipped wheel's
    requirement rules out, where a shipped wheel of that distribution meets it (e.g. a typing-extensions older
    than pydantic 2.14's >= 4.16). What remains is kept as installed by :func:`trl_wheels.choose`."""
    shipped: dict[str, list[str]] = {}
    for w in wheels:
        name, version = wheel_name_version(w)
        shipped.setdefault(name, []).append(version)
    out = dict(have)
    for w in wheels:
        for r in wheel_requires(w, python_version):
            name = canonical(r.name)
            if name in out and name in shipped and not r.specifier.contains(out[name], prereleases=True) and any(
                    r.specifier.contains(v, prereleases=True) for v in shipped[name]):
                _say(f"{name} {out[name]} is too old for {wheel_name_version(w)[0]} ({r}): the shipped one instead")
                del out[name]
    return out


def download(args) -> int:
    os.makedirs(args.dir, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-cache-dir", "-w", args.dir, DEEPSPEED]
    _say("+ DS_BUILD_OPS=0", " ".join(cmd))  # no cache: a wheel built earlier with ops would be taken as it is
    if subprocess.run(cmd, env={**os.environ, "DS_BUILD_OPS": "0"}).returncode:
        return 1
    version = DEEPSPEED.split("==")[1]
    built = [os.path.join(args.dir, n) for n in os.listdir(args.dir)
             if n.endswith(".whl") and wheel_name_version(n) == ("deepspeed", version)]
    problems = check_deepspeed_wheel(built[0]) if len(built) == 1 else [f"built {built}"]
    if problems:
        _say("DeepSpeed's wheel is not fit for the GPU machine:", *problems, sep="\n  ")
        return 1
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    for spec in PINS + tuple(args.extra):
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
               args.python_version, "--implementation", "cp", *plats, "-d", args.dir, spec]
        _say("+", " ".join(cmd))
        if subprocess.run(cmd).returncode:
            return 1
    for src in (os.path.abspath(__file__), os.path.abspath(trl_wheels.__file__)):
        shutil.copy(src, os.path.join(args.dir, os.path.basename(src)))
    with open(os.path.join(args.dir, "install.sh"), "w") as f:
        f.write(INSTALL_SH)
    total = sum(os.path.getsize(os.path.join(args.dir, n)) for n in os.listdir(args.dir))
    _say(f"{args.dir}: {len(os.listdir(args.dir))} files, {total / 2**20:.1f} MiB")
    return 0


def install(args) -> int:
    wheels = sorted(os.path.join(args.dir, n) for n in os.listdir(args.dir) if n.endswith(".whl"))
    if not wheels:
        _say(f"no wheels in {args.dir}: run `python3 benchmarks/deepspeed_wheels.py download` where a registry is "
             "reachable")
        return 1
    foreign = args.python_version not in (None, f"{sys.version_info[0]}.{sys.version_info[1]}")
    have = {} if foreign else stale(wheels, installed_versions(), args.python_version)
    picked, notes = choose(wheels, have, args.all, args.python_version)
    for n in notes:
        _say(n)
    probe = ("import importlib.metadata as m, deepspeed, pydantic, hjson; "
             "from deepspeed.accelerator import get_accelerator; "
             "print(' '.join(f'{d} {m.version(d)}' for d in ('deepspeed', 'pydantic', 'typing-extensions', "
             "'torch')), 'accelerator', get_accelerator()._name)")
    return trl_wheels.install_picked(args, picked, foreign, probe)


def main(argv=None) -> int:
    return trl_wheels.cli(argv, __doc__, download, install, ".wheels/deepspeed", "/tmp/ds-pkgs",
                          "build DeepSpeed's wheel and fetch the pinned ones (here, with a registry)")


if __name__ == "__main__":
    sys.exit(main())
