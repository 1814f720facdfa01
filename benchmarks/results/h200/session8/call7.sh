export PYTHONPATH=src
REST=$(ls tests/test_*.py | grep -v -e test_cross_entropy -e test_large_offsets -e test_bench -e test_fused_linear | tr '\n' ' ')
timeout 320 python3 -m pytest -q -p no:cacheprovider -rfEs $REST > $OUT/pytest_call7.log 2>&1; tail -6 $OUT/pytest_call7.log
