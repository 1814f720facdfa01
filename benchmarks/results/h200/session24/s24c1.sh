# Session 24, call 1 (carry .peers/w): memory="low" after it learned to skip ignored tokens (issue 28 goal 4: <= 50 ms
# at Llama-3-8B's head, <= 100 ms at Gemma-2-9B's, at Liger's peak; the bench ignores every tenth token), its CUDA
# tests, then issue 24's 8B / 7B prediction rows (115 s each was too short in session 23)
#   bash benchmarks/results/h200/session24/s24c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_flce_sliced.py \
  > $W/pytest-flce-sliced.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-flce-sliced.log | tail -6
for M in llama3-8b gemma2-9b; do
  timeout 100 python3 -m tigon.cli bench --op fused_linear_cross_entropy --model $M --tokens 8192 \
    --providers tigon,tigon_low,liger --json $W/flce-low_${M}_$G.json 2>&1 | grep -v Warn | tail -9
done
timeout 300 python3 benchmarks/predict_table.py --rows llama3-8b --timeout 280 --out-dir $W/predict 2>&1 | grep -v Warn | tail -4
(cd $W && tar czf $OUT/s24c1.tgz .) && rm -rf $W
