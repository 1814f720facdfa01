# Session 22, call A (first of three back to back; carry .peers/w, .peers/q0 and .gpu): the CUDA tests of this
# session's kernel changes (cross-entropy's formed default, jsd series, DeepSeek-V4's clamped SwiGLU, sparsemax,
# norms), the cross-entropy L2 study of benchmarks/tune.py, and jsd / kl_div at 16384 x 128256 (issues 21 / 28):
#   bash benchmarks/results/h200/session22/s22cA.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf -x tests/test_cross_entropy.py \
  tests/test_liger_options.py tests/test_divergence.py tests/test_fused_linear_jsd.py tests/test_clamped_swiglu.py \
  tests/test_sparsemax.py tests/test_dyt.py tests/test_group_norm.py tests/test_poly_norm.py tests/test_kernel_globals.py \
  > $W/pytest-cA.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-cA.log | tail -10 | cut -c1-300
timeout 80 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_large_offsets.py \
  -k "cross_entropy or divergence or sparsemax" > $W/pytest-cA-large.log 2>&1
echo "large rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-cA-large.log | tail -5 | cut -c1-300
timeout 100 python3 benchmarks/tune.py --ops cross_entropy:2 --budget-s 85 --out $W/tune-ce_llama3-8b_$G.json 2>&1 \
  | grep -v Warn | tail -30
timeout 90 python3 benchmarks/divergence_tune.py --old .gpu/divergence_04bb6c3.py --rep 100 \
  --out $W/divergence-tune_llama3-8b-16k_$G.json 2>&1 | grep -v Warn | tail -30
(cd $W && tar czf $OUT/s22cA.tgz .) && rm -rf $W
