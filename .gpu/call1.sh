#!/bin/bash
# session 7, call 1: branch ce-grad-in-forward (+ main's bench rotation and W_HOLD)
export PYTHONPATH=src
python3 -m pip install -q --no-deps --no-index .wheels/*.whl 2>&1 | tail -1
git log --oneline -1 > $OUT/call1.log 2>&1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv >> $OUT/call1.log
t0=$(date +%s)
timeout 170 python3 benchmarks/tune_h200.py --out $OUT/tune7_ce.json --parts ce_fwdgrad >> $OUT/call1.log 2>&1
echo "[ce $(( $(date +%s) - t0 ))s]" >> $OUT/call1.log
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_cross_entropy.py tests/test_large_offsets.py tests/test_bench.py tests/test_rms_norm.py > $OUT/pytest_s7_call1.log 2>&1
echo "[pytest $(( $(date +%s) - t0 ))s]" >> $OUT/call1.log
timeout 110 python3 benchmarks/tune_h200.py --out $OUT/tune7_rms.json --parts rms_hold >> $OUT/call1.log 2>&1
echo "[rms $(( $(date +%s) - t0 ))s]" >> $OUT/call1.log
timeout 110 python3 benchmarks/tune_h200.py --out $OUT/tune7_rotate.json --parts rotate >> $OUT/call1.log 2>&1
echo "[rotate $(( $(date +%s) - t0 ))s]" >> $OUT/call1.log
timeout 50 python3 -m tigon.cli bench --op glu_linear --model llama3-8b --cuda-graph --providers eager,compile,tigon,tigon_inplace,liger --json $OUT/bench_glu_linear.json >> $OUT/call1.log 2>&1
echo "[done $(( $(date +%s) - t0 ))s]" >> $OUT/call1.log
tail -5 $OUT/pytest_s7_call1.log
