# Session 25, call 1 (carry .peers/w), for the next GPU session: the fixes of session 25 checked on CUDA and measured.
# - tigon profile's per-op prediction with Tigon's host reads left out (tigon.kernels.host_wait; session 25 measured
#   +145% per op, -4.1% by whole layers, at Llama-3-8B 4 layers on an H100): the same row again (issue 24, +-7%);
# - the DPO family under torch.compile (the bench's tigon_compile column failed in Dynamo in session 25) and the DPO
#   default plan's peak against Liger's 2,601 MiB (issue 29); about 450 s
#   bash benchmarks/results/h200/session25/s25c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_compile_posttrain.py \
  tests/test_preference.py tests/test_preference_ignored_rows.py tests/test_predict.py tests/test_profile_attrib.py \
  > $W/pytest-c1.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c1.log | tail -6
timeout 100 python3 -m tigon.cli bench --op fused_linear_dpo_loss --model llama3-8b --tokens 8192 \
  --providers compile,tigon,tigon_compile,tigon_lean,tigon_416mib,liger --json $W/posttrain_dpo_$G.json 2>&1 | grep -v Warn | tail -12
timeout 250 python3 benchmarks/predict_table.py --rows llama3-8b --timeout 240 --out-dir $W 2>&1 | grep -v Warn | tail -4
(cd $W && tar czf $OUT/s25c1.tgz .) && rm -rf $W
