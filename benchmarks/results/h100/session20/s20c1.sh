# Session 20, call 1 (H200): the CUDA tests of the kernels and launch paths added since the last GPU run
# (act_linear, lora_qkv_rope, launch_mode, checkpointing, compiled post-training, vocab parallel); Llama-3.2-1B
# 16 layers 4 x 2048 compiled with the causal-mask change (issues 26 / 28); Qwen2.5-0.5B eager after the host cuts.
# Run from the repository root: bash benchmarks/results/h100/session20/s20c1.sh (carry .peers/w for Liger).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader; git log --oneline -1 2>/dev/null
timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_act_linear.py tests/test_glu.py \
  tests/test_lora_qkv_rope.py tests/test_rope.py tests/test_host_launch.py tests/test_checkpointing.py \
  tests/test_compile_posttrain.py tests/test_lora_gate_up.py tests/test_vocab_parallel.py > $W/pytest-c1.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c1.log | tail -14 | cut -c1-300
timeout 300 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --timeout 145 --gpu $G --providers original_compile,tigon_compile --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -8
timeout 110 python3 benchmarks/e2e_table.py --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 \
  --timeout 50 --gpu $G --providers original,tigon --out-dir $W/e2e-qwen05 2>&1 | grep -v Warn | tail -6
(cd $W && tar czf $OUT/s20c1.tgz .) && rm -rf $W
