# Session 22, call E (carry .peers/w and .gpu): after call D's compile failures under the GPU image's Triton 3.6
# (fixed): the CUDA tests of the norms that share partial_sums._load_tile and the dyt / poly_norm backward study
# (issue 21); cross-entropy's formed gradient at Liger's launch (issue 28):
#   bash benchmarks/results/h200/session22/s22cE.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_dyt.py \
  tests/test_poly_norm.py tests/test_rms_norm.py tests/test_fused_add_rms_norm.py > $W/pytest-cE.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-cE.log | tail -12 | cut -c1-300
timeout 70 python3 benchmarks/tune.py --ops dyt,poly_norm --peers '' --budget-s 55 \
  --out $W/tune-dyt-poly_llama3-8b-16k_$G.json 2>&1 | grep -v Warn | tail -8
timeout 45 python3 benchmarks/tune.py --ops cross_entropy:3 --peers liger --budget-s 32 \
  --out $W/tune-ce-liger-launch_llama3-8b-8k_$G.json 2>&1 | grep -v Warn | tail -3
(cd $W && tar czf $OUT/s22cE.tgz .) && rm -rf $W
