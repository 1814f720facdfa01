# Session 22, call E (carry .peers/w and .gpu): after call D's compile failures under the GPU image's Triton 3.6
# (fixed): the CUDA tests of the norms that share partial_sums._load_tile, the dyt / poly_norm backward study, the
# cross-entropy default with its L2 hints against Liger, and jsd / kl_div at 16384 x 128256 (issues 21 / 28):
#   bash benchmarks/results/h200/session22/s22cE.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_dyt.py \
  tests/test_poly_norm.py tests/test_rms_norm.py tests/test_fused_add_rms_norm.py > $W/pytest-cE.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-cE.log | tail -12 | cut -c1-300
timeout 95 python3 benchmarks/tune.py --ops dyt,poly_norm --peers liger --budget-s 75 \
  --out $W/tune-dyt-poly_llama3-8b-16k_$G.json 2>&1 | grep -v Warn | tail -8
timeout 40 python3 -m tigon.cli bench --op cross_entropy --model llama3-8b --tokens 8192 --providers tigon,liger \
  --cuda-graph --quiet --json $W/bench-ce-graph_$G.json 2>&1 | grep -v Warn | tail -3
timeout 55 python3 benchmarks/divergence_tune.py --old .gpu/divergence_04bb6c3.py --rep 30 \
  --cases jsd_beta0.5,kl_div_prob_target --out $W/divergence-tune_llama3-8b-16k_$G.json 2>&1 \
  | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s22cE.tgz .) && rm -rf $W
