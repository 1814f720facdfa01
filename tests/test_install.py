"""Installing Tigon as a library: the wheel built from this checkout, installed into a fresh virtual environment, runs
``tigon env``; ``python -m tigon`` and ``--version`` report ``tigon.__version__``.

The fresh environment gets the wheel with ``--no-deps`` and sees this interpreter's site-packages (torch, Triton,
transformers) through a ``.pth`` line, so nothing is downloaded and the test stays a few seconds long; the wheel's
own files (package, console script, metadata) are what is tested. The checkout's ``src`` is not on its path.
"""

import os
import runpy
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import tigon

ROOT = Path(__file__).resolve().parents[1]


def _env_without_checkout() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def test_python_m_tigon_and_version(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["tigon", "--version"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("tigon", run_name="__main__")  # what `python -m tigon --version` runs
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"tigon {tigon.__version__}"


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs_tigon_env(tmp_path):
    # Build from a copy, so that the checkout gets no build/ or *.egg-info.
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, project / name)
    shutil.copytree(ROOT / "src", project / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(tmp_path / "dist"),
                    str(project)], check=True, capture_output=True, timeout=120)
    wheel = next((tmp_path / "dist").glob("tigon-*.whl"))
    assert wheel.name.startswith(f"tigon-{tigon.__version__}-")
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(f"tigon-{tigon.__version__}.dist-info/METADATA").decode()
        assert "tigon/cli/__main__.py" in z.namelist() and "tigon/__main__.py" in z.namelist()
    assert "Requires-Dist: torch" in meta and "Provides-Extra: hf" in meta

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    # (without PYTHONPATH: with src/ on it, and src/tigon.egg-info from an editable install, pip finds tigon
    # "already satisfied" and installs nothing)
    subprocess.run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)], check=True,
                   capture_output=True, timeout=120, env=_env_without_checkout())
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    deps = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # torch & co. of this interpreter
    (site / "zz_test_dependencies.pth").write_text("".join(f"{p}\n" for p in deps))

    env = _env_without_checkout()
    find = "import importlib.util; print(importlib.util.find_spec('tigon').origin)"
    where = subprocess.run([str(python), "-c", find],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()).is_relative_to(site), where  # the wheel's tigon, not the checkout's
    proc = subprocess.run([str(venv / "bin" / "tigon"), "env"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert tigon.__version__ in proc.stdout and "rms_norm" in proc.stdout
