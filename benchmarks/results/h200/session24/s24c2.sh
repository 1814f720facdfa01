# Session 24, call 2 (carry .peers/w): issue 29's post-training rows at Llama-3-8B's head, 8192 tokens, beside
# torch.compile of the plain loss and of Tigon's call (owed since session 13), with the DPO family's memory="low"
# (tigon_lean: one pair a chunk, grad_weight in bf16; goal <= 1.5 GiB) and the JSD's ignored-row skipping; about 400 s
#   bash benchmarks/results/h200/session24/s24c2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_preference_ignored_rows.py \
  > $W/pytest-pref-ignored.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-pref-ignored.log | tail -4
for OP in fused_linear_dpo_loss fused_linear_grpo fused_linear_jsd; do
  timeout 170 python3 -m tigon.cli bench --op $OP --model llama3-8b --tokens 8192 \
    --providers eager,compile,tigon,tigon_compile,tigon_lean,liger --json $W/posttrain_${OP}_$G.json 2>&1 \
    | grep -v Warn | tail -9
done
(cd $W && tar czf $OUT/s24c2.tgz .) && rm -rf $W
