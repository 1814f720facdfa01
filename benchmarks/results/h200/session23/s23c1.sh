# Session 23, call 1 (carry .peers/w and .peers/q0; stages the first third of the CuTe DSL runtime): session 22's
# call E (dyt / poly_norm / rms_norm CUDA tests and backward study, issue 21; cross-entropy at Liger's launch, issue 28)
#   bash benchmarks/results/h200/session23/s23c1.sh
source benchmarks/results/h200/session22/peers3.sh
bash benchmarks/results/h200/session22/s22cE.sh
# then the fused linear cross-entropy's memory="low" (the sliced exact plan, issue 28 goal 4) against the default, the
# bf16 accumulation and Liger, at Llama-3-8B's and Gemma-2-9B's heads (8192 tokens), and its CUDA tests
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1; W=$OUT/w1; mkdir -p $W
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
for M in llama3-8b gemma2-9b; do
  timeout 100 python3 -m tigon.cli bench --op fused_linear_cross_entropy --model $M --tokens 8192 \
    --providers tigon,tigon_lean,tigon_low,liger --json $W/flce-low_${M}_$G.json 2>&1 | grep -v Warn | tail -14
done
timeout 80 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_fused_linear_cross_entropy.py \
  > $W/pytest-flce.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-flce.log | tail -8
(cd $W && tar czf $OUT/s23c1-flce.tgz .) && rm -rf $W
