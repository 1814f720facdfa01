# Session 20, call 2: call 1's failing CUDA tests after the test fixes (device of the act_linear inputs; fused
# attention heads in the checkpointing matrix on CUDA; the softcap refusal raised explicitly for transformers 5.17);
# the causal mask under compile with the packed-sequence wrapper (diagnostic, 1B / Qwen2.5-0.5B / SmolLM2 compiled
# and eager rows, kernel summary of the 1B compiled step). Issues 26 / 28.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_act_linear.py tests/test_checkpointing.py tests/test_causal_mask.py > $W/pytest-c2.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c2.log | tail -8 | cut -c1-300
for a in "" --original; do timeout 60 python3 benchmarks/results/h100/session20/causal_diag.py $a 2>&1 | grep -v -i warn | tail -7 | cut -c1-200; done
E2E="python3 benchmarks/e2e_table.py --steps 10 --warmup 3 --gpu $G"
timeout 150 $E2E --model llama3.2-1b --batch-size 4 --seq-len 2048 --timeout 70 --providers original_compile,tigon_compile,tigon --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -7
timeout 60 python3 -m tigon.cli bench --e2e --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 4 --warmup 3 --providers tigon_compile --kernel-summary --json $W/e2e-1b-tigon_compile-kernel-summary_${G}.json 2>&1 | grep -v -i warn | tail -16 | cut -c1-160
timeout 100 $E2E --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --timeout 60 --providers original_compile,tigon_compile --out-dir $W/e2e-qwen05 2>&1 | grep -v Warn | tail -6
timeout 170 $E2E --model smollm2-360m --batch-size 8 --seq-len 2048 --timeout 60 --providers original,original_compile,tigon,tigon_compile --out-dir $W/e2e-smollm2 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s20c2.tgz .) && rm -rf $W
