# Session 18, call 3: the one JSD failure of call 2 with its traceback; Llama-3.2-1B 16 layers 4 x 2048 compiled:
# HF + compile and Tigon + compile (issues 26 / 28), one process each.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
timeout 45 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short "tests/test_fused_linear_jsd.py::test_gpu_llm_head_sizes_bf16_no_worse_than_plain_and_less_memory" 2>&1 | grep -E "^E |passed|failed" | head -12 | cut -c1-300
timeout 300 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 --timeout 145 --gpu h100 --providers original_compile,tigon_compile --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s18c3.tgz .) && rm -rf $W
