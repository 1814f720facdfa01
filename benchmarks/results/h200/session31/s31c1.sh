# Session 31, call 1 (carry .peers/w): session 30's two open CUDA failures diagnosed (bf16 log-probs against three
# plain roundings; the DPO call's matmul list), the post-training / divergence CUDA tests, and kl_div / jsd / tvd
# timed after kl_div's unbiased log (Tigon, Liger, torch.compile; host-inclusive and CUDA-graph bases); about 330 s
#   bash benchmarks/results/h200/session31/s31c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 120 python3 benchmarks/results/h200/session30/diag_s30.py > $W/diag_s30.log 2>&1; echo "diag rc $?"
grep -v Warn $W/diag_s30.log | tail -30; date
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_fused_linear_logprobs.py \
  tests/test_preference.py tests/test_compile_posttrain.py tests/test_divergence.py tests/test_moe_experts.py \
  -m "slow or not slow" > $W/pytest-s31c1.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s31c1.log | tail -10; date
for B in "" "--cuda-graph"; do
  timeout 100 python3 -m tigon.cli bench --op kl_div jsd tvd --model llama3-8b --tokens 8192 \
    --providers tigon,liger,compile $B --json $W/div${B:+-graph}_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -14
  date
done
(cd $W && tar czf $OUT/s31c1.tgz .) && rm -rf $W
