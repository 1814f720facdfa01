"""Runs each benchmark script given as ``script [args...]`` (one per JSON argument) in this one interpreter, as
``python script args`` would, and prints a JSON map name -> [output, exit status]: tests/test_benchmarks.py's
checks without a torch import per script (CI time)."""

import contextlib
import io
import json
import runpy
import sys

if __name__ == "__main__":
    results = {}
    for name, argv in json.loads(sys.argv[1]).items():
        out, rc, path = io.StringIO(), 0, list(sys.path)
        sys.argv = list(argv)
        sys.path.insert(0, str(__import__("pathlib").Path(argv[0]).resolve().parent))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                runpy.run_path(argv[0], run_name="__main__")
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException as e:  # noqa: BLE001 - reported as the script's failure
                print(f"{type(e).__name__}: {e}")
                rc = 1
        sys.path[:] = path
        results[name] = [out.getvalue(), rc]
    print(json.dumps(results))
