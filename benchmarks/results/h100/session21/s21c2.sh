# Session 21, call 2: call 1's failing CUDA tests after their set-up fixes (checkpointing's fused-heads config, the
# in-place address check, the GLU multipliers' sizes on CUDA, DeepSpeed's batches on the engine's device); DeepSpeed
# on one GPU (issue 22); Qwen2.5-0.5B 4 x 1024 bf16 with every provider, eager and compiled (issue 28).
# Run from the repository root, carry .peers/w and .wheels/deepspeed: bash benchmarks/results/h100/session21/s21c2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_checkpointing.py \
  tests/test_rms_norm.py tests/test_fused_add_rms_norm.py tests/test_liger_options.py > $W/pytest-c2.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c2.log | tail -10 | cut -c1-300
(eval "$(sh .wheels/deepspeed/install.sh 2> $W/ds-install.log)"; timeout 90 python3 -m pytest -v -s -p no:cacheprovider \
  -p no:logging --tb=short tests/test_deepspeed.py > $W/deepspeed.log 2>&1)
echo "deepspeed rc $?"; grep -E "^RESULT|rank 0/1|passed|failed|skipped" $W/deepspeed.log | tail -12 | cut -c1-300
timeout 300 python3 benchmarks/e2e_table.py --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 \
  --timeout 62 --gpu $G --providers original,original_compile,liger,tigon,tigon_compile --out-dir $W/e2e-qwen05 \
  2>&1 | grep -v Warn | tail -9
(cd $W && tar czf $OUT/s21c2.tgz .) && rm -rf $W
