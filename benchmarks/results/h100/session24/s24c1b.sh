# Session 24, call 1b (carry .peers/w; call 1 cut to the device time left after failed starts, about 250 s): the
# CUDA tests of the ignored-row skipping (fused CE, sliced plan, float16, JSD, preference losses), the fused linear CE
# at Llama-3-8B's head (issue 28 goal 4), the DPO row with memory="low" (issue 29), sparsemax's launch configs
#   bash benchmarks/results/h100/session24/s24c1b.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 90 python3 -m pytest -q -x -p no:cacheprovider -p no:logging --tb=short -rf tests/test_ignored_rows.py \
  tests/test_flce_sliced.py tests/test_preference_ignored_rows.py tests/test_fused_linear_jsd.py -k "not gpu_llm" \
  > $W/pytest-skip.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-skip.log | tail -4
timeout 60 python3 -m tigon.cli bench --op fused_linear_cross_entropy --model llama3-8b --tokens 8192 \
  --providers tigon,tigon_low,liger --json $W/flce-low_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -7
timeout 50 python3 -m tigon.cli bench --op fused_linear_dpo_loss --model llama3-8b --tokens 8192 \
  --providers tigon,tigon_lean,liger --json $W/dpo_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -6
timeout 30 python3 benchmarks/sparsemax_tune.py --shapes 16384x4096 --scales 1 --configs 1x2,1x4,2x4 \
  --out $W/sparsemax-configs_$G.json 2>&1 | grep -v Warn | cut -c1-700 | tail -2
