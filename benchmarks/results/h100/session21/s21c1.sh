# Session 21, call 1: the CUDA tests of session 20's host cuts and checkpointing fixes; DeepSpeed ZeRO-3 on one
# GPU (issue 22); Llama-3.2-1B 16 layers 4 x 2048 bf16 with every provider in one run, eager and compiled
# (issues 26 / 28). Run from the repository root, carry .peers/w and .wheels/deepspeed:
#   bash benchmarks/results/h100/session21/s21c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 140 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_checkpointing.py \
  tests/test_rms_norm.py tests/test_glu.py tests/test_rope.py tests/test_fused_add_rms_norm.py tests/test_liger_options.py \
  > $W/pytest-c1.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c1.log | tail -10 | cut -c1-300
(eval "$(sh .wheels/deepspeed/install.sh 2> $W/ds-install.log)"; timeout 100 python3 -m pytest -v -s -p no:cacheprovider -p no:logging --tb=short \
  tests/test_deepspeed.py > $W/deepspeed.log 2>&1)
echo "deepspeed rc $?"; grep -E "PASS|FAIL|ERROR|passed|failed|skipped" $W/deepspeed.log | tail -6 | cut -c1-300
timeout 300 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --timeout 62 --gpu $G --providers original,original_compile,liger,tigon,tigon_compile --out-dir $W/e2e-1b \
  2>&1 | grep -v Warn | tail -9
(cd $W && tar czf $OUT/s21c1.tgz .) && rm -rf $W
