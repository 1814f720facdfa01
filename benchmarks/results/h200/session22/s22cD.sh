# Session 22, call D (one call; carry .peers/w and .gpu): the CUDA tests of this session's kernel changes
# (cross-entropy's formed default, jsd series, DeepSeek-V4's clamped SwiGLU, sparsemax, dyt / poly_norm / group_norm);
# the cross-entropy L2 study (issue 28, goal 3), sparsemax's new forward against the old one and the
# dyt / poly_norm / group_norm backward study (issue 21):
#   bash benchmarks/results/h200/session22/s22cD.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 110 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_cross_entropy.py \
  tests/test_divergence.py tests/test_clamped_swiglu.py tests/test_sparsemax.py tests/test_dyt.py \
  tests/test_group_norm.py tests/test_poly_norm.py tests/test_kernel_globals.py tests/test_liger_options.py \
  > $W/pytest-cD.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-cD.log | tail -12 | cut -c1-300
timeout 65 python3 benchmarks/tune.py --ops cross_entropy:2 --peers liger --budget-s 50 \
  --out $W/tune-ce-l2_llama3-8b-8k_$G.json 2>&1 | grep -v Warn | tail -16
timeout 70 python3 benchmarks/sparsemax_tune.py --out $W/sparsemax-tune_$G.json 2>&1 | grep -v Warn | tail -16
timeout 105 python3 benchmarks/tune.py --ops dyt,poly_norm,group_norm --peers '' --budget-s 90 \
  --out $W/tune-norms_llama3-8b-16k_$G.json 2>&1 | grep -v Warn | tail -40
(cd $W && tar czf $OUT/s22cD.tgz .) && rm -rf $W
