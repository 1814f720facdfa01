export PYTHONPATH=src
python3 -m pip install -q --no-deps --no-index .wheels/*.whl 2>&1 | tail -1
FIRST="tests/test_cross_entropy.py tests/test_large_offsets.py tests/test_bench.py tests/test_fused_linear_cross_entropy.py tests/test_verify.py"
REST=$(ls tests/test_*.py | grep -v -e test_cross_entropy -e test_large_offsets -e test_bench -e test_fused_linear -e test_verify | tr '\n' ' ')
timeout 190 python3 -m pytest -q -p no:cacheprovider -rfEs $FIRST $REST > $OUT/pytest_call6.log 2>&1; tail -4 $OUT/pytest_call6.log
P=compile,tigon,tigon_inplace,tigon_fwdgrad,liger
timeout 140 python3 benchmarks/sweep_h200.py --out $OUT/sweep9a_ce_graph.json --ops cross_entropy --axes tokens --providers $P --tokens 1024,2048,4096,8192 > $OUT/sweep9a.log 2>&1; grep tigon/best $OUT/sweep9a.log
timeout 190 python3 benchmarks/sweep_h200.py --out $OUT/sweep9b_ce_graph.json --ops cross_entropy --axes tokens --providers $P --tokens 16384,32768,65536 > $OUT/sweep9b.log 2>&1; grep tigon/best $OUT/sweep9b.log
timeout 50 python3 benchmarks/sweep_h200.py --out $OUT/sweep9c_ce_plain_small.json --ops cross_entropy --axes tokens --providers compile,tigon,tigon_fwdgrad,liger --plain-ops cross_entropy --tokens 1024,2048 > $OUT/sweep9c.log 2>&1; grep tigon/best $OUT/sweep9c.log
