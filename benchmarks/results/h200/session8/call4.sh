export PYTHONPATH=src
python3 -m pip install -q --no-deps --no-index .wheels/*.whl 2>&1 | tail -1
timeout 120 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_cross_entropy.py tests/test_bench.py tests/test_large_offsets.py -k "cross_entropy or grad_in_forward or masked or bench or cuda_graph" > $OUT/pytest_call4.log 2>&1; tail -3 $OUT/pytest_call4.log
P=compile,tigon,tigon_inplace,tigon_fwdgrad,liger
timeout 150 python3 benchmarks/sweep_h200.py --out $OUT/sweep8a_ce_graph.json --ops cross_entropy --axes tokens --providers $P --tokens 1024,2048,4096,8192 > $OUT/sweep8a.log 2>&1; grep tigon/best $OUT/sweep8a.log
timeout 200 python3 benchmarks/sweep_h200.py --out $OUT/sweep8b_ce_graph.json --ops cross_entropy --axes tokens --providers $P --tokens 16384,32768,65536 > $OUT/sweep8b.log 2>&1; grep tigon/best $OUT/sweep8b.log
timeout 60 python3 benchmarks/sweep_h200.py --out $OUT/sweep8c_ce_plain_small.json --ops cross_entropy --axes tokens --providers compile,tigon,tigon_fwdgrad,liger --plain-ops cross_entropy --tokens 1024,2048 > $OUT/sweep8c.log 2>&1; grep tigon/best $OUT/sweep8c.log
