# Session 32's CUDA test call (any card; carry nothing): the kernels and tests changed this session (the soft-cap's
# derivative in the loss kernels, the log-probs bf16 comparisons with cuBLAS's reduced-precision reductions off, the
# loss-option sweeps), then the post-training files session 31's and 32's calls cut at 150 s, with their summary;
# about 300 s
#   bash benchmarks/results/h200/session32/s32t.sh
export PYTHONPATH=$PWD/src:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_fused_linear_logprobs.py \
  tests/test_loss_options_fuzz.py tests/test_cross_entropy.py tests/test_fused_linear_jsd.py -m "slow or not slow" \
  > $W/pytest-s32t-a.log 2>&1; echo "pytest A rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s32t-a.log | tail -12
date
timeout 140 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_preference.py \
  tests/test_compile_posttrain.py tests/test_divergence.py -m "slow or not slow" \
  > $W/pytest-s32t-b.log 2>&1; echo "pytest B rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s32t-b.log | tail -12
date
(cd $W && tar czf $OUT/s32t.tgz .) && rm -rf $W
