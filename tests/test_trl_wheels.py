"""benchmarks/trl_wheels.py's choice of wheels for the GPU machine, on fake wheels (a METADATA file each): what the
interpreter has is never installed over, and of several versions the newest whose requirements hold is taken."""

import importlib.util
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("trl_wheels", ROOT / "benchmarks" / "trl_wheels.py")
trl_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trl_wheels)


def fake_wheel(folder: Path, name: str, version: str, requires=()) -> str:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires] + ["", "a description: Requires-Dist: not-a-header"]
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", "\n".join(meta))
    return str(path)


def names(paths):
    return sorted(Path(p).name.split("-py3")[0] for p in paths)


def test_choice_keeps_installed_and_picks_the_newest_satisfiable(tmp_path):
    wheels = [fake_wheel(tmp_path, "trl", "1.16.0", ["datasets>=4.7.0", "pyarrow>=21", "pytest; extra == 'test'"]),
              fake_wheel(tmp_path, "datasets", "5.2.0", ["pyarrow>=24.0.0", "huggingface-hub<3.0,>=1.31.0", "dill"]),
              fake_wheel(tmp_path, "datasets", "4.8.5", ["pyarrow>=21.0.0", "huggingface-hub<2.0,>=0.25.0", "dill"]),
              fake_wheel(tmp_path, "dill", "0.4.1"), fake_wheel(tmp_path, "liger_kernel", "0.8.5", ["torch"])]
    gpu = {"huggingface-hub": "1.33.0", "torch": "2.11.0"}
    picked, notes = trl_wheels.choose(wheels, {**gpu, "pyarrow": "26.0.1"}, python_version="3.12")
    assert names(picked) == ["datasets-5.2.0", "dill-0.4.1", "liger_kernel-0.8.5", "trl-1.16.0"] and not any(
        n.startswith("WARNING") for n in notes), notes
    picked, _ = trl_wheels.choose(wheels, {**gpu, "pyarrow": "22.0.0"}, python_version="3.12")
    assert "datasets-4.8.5" in names(picked)  # the newer one needs pyarrow >= 24
    picked, notes = trl_wheels.choose(wheels, {**gpu, "pyarrow": "26.0.1", "dill": "0.3.9", "liger-kernel": "0.8.5"})
    assert names(picked) == ["datasets-5.2.0", "trl-1.16.0"]  # the interpreter's dill and Liger are kept
    assert any("kept the interpreter's dill 0.3.9" in n for n in notes), notes
    _, notes = trl_wheels.choose(wheels, {**gpu, "pyarrow": "19.0.0"})
    assert any(n.startswith("WARNING trl needs pyarrow>=21") for n in notes), notes
    picked, _ = trl_wheels.choose(wheels, {**gpu, "pyarrow": "26.0.1", "trl": "1.0"}, install_all=True)
    assert len(picked) == 4  # one wheel of every distribution


def test_wheel_names_are_canonical():
    assert trl_wheels.wheel_name_version("/x/Liger_Kernel-0.8.5-py3-none-any.whl") == ("liger-kernel", "0.8.5")
    assert trl_wheels.canonical("huggingface_hub") == "huggingface-hub"
