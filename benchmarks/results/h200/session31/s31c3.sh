# Session 31, call 3 (carry .peers/w): session 30's call 2 with the DPO row's 416 MiB plan added: issue 29's loss
# rows at the current code (GRPO, fused linear JSD, DPO with the reference in the same pass; 8192 tokens, hidden
# 4096, vocab 128256) against torch.compile of the plain loss and Liger, with the CUDA tests of the post-training
# and profile-prediction code; then issue 21's op table's eager column (host-inclusive); about 470 s
#   bash benchmarks/results/h200/session31/s31c3.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_compile_posttrain.py \
  tests/test_preference.py tests/test_preference_ignored_rows.py tests/test_predict.py tests/test_profile_attrib.py \
  > $W/pytest-s31c3.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s31c3.log | tail -6
date
for OP in fused_linear_jsd fused_linear_grpo fused_linear_dpo_loss; do
  timeout 110 python3 -m tigon.cli bench --op $OP --model llama3-8b --tokens 8192 \
    --providers compile,tigon,tigon_lean,liger$([ $OP = fused_linear_dpo_loss ] && echo ,tigon_416mib) --json $W/posttrain-${OP}_llama3-8b_$G.json 2>&1 | grep -v Warn | tail -9
  date
done
OPS=group_norm,sparsemax,dyt,poly_norm,softmax,relu_squared,jsd,kl_div,tvd,tiled_mlp
timeout 100 python3 benchmarks/op_table.py --model llama3-8b --ops $OPS --tokens 16384,jsd=8192,kl_div=8192,tvd=8192 \
  --providers eager --bases host --timeout 90 --gpu $G --out-dir $W/op21 2>&1 | grep -v Warn | tail -16; date
(cd $W && tar czf $OUT/s31c3.tgz .) && rm -rf $W
