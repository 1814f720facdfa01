# Session 20, call 2: call 1's failing CUDA tests after the test fixes (device of the act_linear inputs; fused
# attention heads in the checkpointing matrix on CUDA; the softcap refusal raised explicitly for transformers 5.17);
# the causal-mask wrapper under compile (diagnostic + kernel summary of the 1B compiled step); Qwen2.5-0.5B compiled;
# profile's prediction table for the two small rows (issue 24).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_act_linear.py tests/test_checkpointing.py > $W/pytest-c2.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c2.log | tail -8 | cut -c1-300
for a in "" --original; do timeout 60 python3 benchmarks/results/h100/session20/causal_diag.py $a 2>&1 | grep -v -i warn | tail -9 | cut -c1-220; done
timeout 100 python3 -m tigon.cli bench --e2e --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 5 --warmup 3 --providers tigon_compile --kernel-summary --json $W/e2e-1b-tigon_compile-kernel-summary_${G}.json 2>&1 | grep -v -i warn | tail -22 | cut -c1-200
timeout 150 python3 benchmarks/e2e_table.py --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 \
  --timeout 70 --gpu $G --providers original_compile,tigon_compile --out-dir $W/e2e-qwen05 2>&1 | grep -v Warn | tail -6
timeout 200 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b --timeout 95 --out-dir $W/predict 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s20c2.tgz .) && rm -rf $W
