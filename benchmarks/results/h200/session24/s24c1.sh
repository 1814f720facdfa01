# Session 24, call 1 (carry .peers/w): the fused linear CE's default and memory="low" plans after they learned to skip
# ignored tokens (issue 28 goal 4: <= 50 ms at Llama-3-8B's head, <= 100 ms at Gemma-2-9B's, at Liger's peak; the
# bench ignores every tenth token) and their CUDA tests; the fused linear JSD with ignored rows skipped (issue 29:
# >= 84% of the matmul floor); sparsemax's register-path launch configs (issue 21: 71% at scale 1); the DPO
# family's memory="low" (one pair a chunk; issue 29: <= 1.5 GiB); about 400 s
#   bash benchmarks/results/h200/session24/s24c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 80 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_flce_sliced.py \
  tests/test_ignored_rows.py tests/test_flce_fp16.py \
  > $W/pytest-flce-sliced.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-flce-sliced.log | tail -6
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_fused_linear_jsd.py \
  tests/test_preference_ignored_rows.py > $W/pytest-jsd-pref.log 2>&1; echo "pytest rc $?"
grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-jsd-pref.log | tail -4
for M in llama3-8b gemma2-9b; do
  timeout 75 python3 -m tigon.cli bench --op fused_linear_cross_entropy --model $M --tokens 8192 \
    --providers tigon,tigon_low,liger --json $W/flce-low_${M}_$G.json 2>&1 | grep -v Warn | tail -9
done
timeout 50 python3 -m tigon.cli bench --op fused_linear_jsd --model llama3-8b --tokens 8192 \
  --providers tigon,tigon_1gib,liger --json $W/jsd_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -6
timeout 60 python3 -m tigon.cli bench --op fused_linear_dpo_loss --model llama3-8b --tokens 8192 \
  --providers tigon,tigon_lean,liger --json $W/dpo_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -6
timeout 40 python3 benchmarks/sparsemax_tune.py --shapes 16384x4096 --configs 1x1,1x2,1x4,1x16,2x2,2x4,4x4,4x16 \
  --out $W/sparsemax-configs_$G.json 2>&1 | grep -v Warn | cut -c1-900 | tail -3
(cd $W && tar czf $OUT/s24c1.tgz .) && rm -rf $W
