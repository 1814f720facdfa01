"""benchmarks/deepspeed_wheels.py on fake wheels (a METADATA file each): a distribution the interpreter has at a
version a shipped wheel rules out is installed over (typing-extensions for pydantic 2.14), any other is kept; a
DeepSpeed wheel with a platform tag or ops built ahead of time is refused; the pins cover what the GPU image lacks."""

import importlib.util
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("deepspeed_wheels", ROOT / "benchmarks" / "deepspeed_wheels.py")
deepspeed_wheels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(deepspeed_wheels)

from test_trl_wheels import fake_wheel, names  # noqa: E402

OPS = "installed_ops={{'async_io': False, 'cpu_adam': {adam}, 'fused_adam': False}}\naccelerator_name='cpu'\n"


def ds_wheel(folder: Path, tags: str = "py3-none-any", adam: bool = False, extra: str | None = None) -> str:
    path = folder / f"deepspeed-0.19.8-{tags}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("deepspeed/git_version_info_installed.py", "version='0.19.8'\n" + OPS.format(adam=adam))
        z.writestr("deepspeed-0.19.8.dist-info/METADATA", "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
        if extra:
            z.writestr(extra, b"")
    return str(path)


def test_stale_installs_over_what_a_shipped_wheel_rules_out(tmp_path):
    wheels = [fake_wheel(tmp_path, "pydantic", "2.14.4", ["pydantic-core==2.50.5", "typing-extensions>=4.16.0"]),
              fake_wheel(tmp_path, "pydantic_core", "2.50.5", ["typing-extensions>=4.16.0"]),
              fake_wheel(tmp_path, "typing_extensions", "4.16.0"),
              fake_wheel(tmp_path, "deepspeed", "0.19.8", ["numpy", "pydantic>=2.0.0", "torch>=2.0.0"])]
    gpu = {"torch": "2.11.0", "numpy": "2.3.0"}
    old = deepspeed_wheels.stale(wheels, {**gpu, "typing-extensions": "4.12.2"})
    assert "typing-extensions" not in old and old["torch"] == "2.11.0"
    picked, notes = deepspeed_wheels.choose(wheels, old, python_version="3.12")
    assert names(picked) == ["deepspeed-0.19.8", "pydantic-2.14.4", "pydantic_core-2.50.5",
                             "typing_extensions-4.16.0"] and not any(n.startswith("WARNING") for n in notes), notes
    new = {**gpu, "typing-extensions": "4.16.1"}
    assert deepspeed_wheels.stale(wheels, new) == new  # new enough: kept
    picked, notes = deepspeed_wheels.choose(wheels, new, python_version="3.12")
    assert "typing_extensions-4.16.0" not in names(picked)
    assert any("kept the interpreter's typing-extensions 4.16.1" in n for n in notes), notes
    # a requirement the shipped wheel does not meet either: kept (choose warns), not replaced by something no better
    wants_more = [fake_wheel(tmp_path, "wants_more", "1.0", ["typing-extensions>=5"]), wheels[2]]
    assert deepspeed_wheels.stale(wants_more, new) == new


def test_deepspeed_wheel_check(tmp_path):
    assert deepspeed_wheels.check_deepspeed_wheel(ds_wheel(tmp_path)) == []
    (tmp_path / "b").mkdir()
    bad = deepspeed_wheels.check_deepspeed_wheel(ds_wheel(tmp_path / "b", tags="cp311-cp311-linux_x86_64", adam=True,
                                                          extra="deepspeed/ops/adam/cpu_adam_op.so"))
    assert len(bad) == 3, bad
    assert "not py3-none-any" in bad[0] and "['cpu_adam']" in bad[1] and "cpu_adam_op.so" in bad[2]


def test_pins_cover_what_the_gpu_image_lacks():
    pinned = {deepspeed_wheels.canonical(p.split("==")[0]) for p in deepspeed_wheels.PINS}
    assert all("==" in p for p in deepspeed_wheels.PINS + (deepspeed_wheels.DEEPSPEED,))
    assert {"hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection"} <= pinned
    assert deepspeed_wheels.DEEPSPEED == "deepspeed==0.19.8"  # tests/test_deepspeed.py's measured version
