# Session 17, call 3 (H100): the first failure of each file that failed in call 1, with its traceback.
export PYTHONPATH=$PWD/src PYTHONUNBUFFERED=1
timeout 55 python3 -m pytest -x -q -p no:cacheprovider --tb=short tests/test_compile_posttrain.py 2>&1 | grep -v "^  warn\|Warning" | tail -30 | cut -c1-300
timeout 60 python3 -m pytest -x -q -p no:cacheprovider --tb=short tests/test_divergence.py 2>&1 | tail -30 | cut -c1-300
timeout 55 python3 -m pytest -x -q -p no:cacheprovider --tb=short tests/test_checkpointing.py 2>&1 | tail -30 | cut -c1-300
