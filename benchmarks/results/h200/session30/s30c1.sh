# Session 30, call 1 (carry .peers/w): the CUDA tests of sessions 28-29's kernel paths (soft-capped JSD, the
# vocabulary mean, Llama 4, sparsemax, the MoE experts), then issue 21's op table on the card at hand: its ten ops at
# Llama-3-8B sizes (the divergences at 8192 x 128256) for Tigon, Liger (Triton) and torch.compile in both bases; then
# issue 26's Llama-3.2-1B row (16 layers, no checkpointing) after the fused loss's 4096-row chunk cap beside its fp32
# accumulator (Liger, Tigon); about 560 s
#   bash benchmarks/results/h200/session30/s30c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W/op21; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 100 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_moe_experts.py \
  tests/test_sparsemax.py tests/test_llama4_vlm.py tests/test_fused_linear_logprobs.py tests/test_fused_linear_jsd.py \
  tests/test_trl_softcap.py tests/test_env.py -m "slow or not slow" > $W/pytest-s30c1.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s30c1.log | tail -8; date
OPS=group_norm,sparsemax,dyt,poly_norm,softmax,relu_squared,jsd,kl_div,tvd,tiled_mlp
TOK=16384,jsd=8192,kl_div=8192,tvd=8192
timeout 310 python3 benchmarks/op_table.py --model llama3-8b --ops $OPS --tokens $TOK --providers tigon,liger,compile \
  --timeout 75 --gpu $G --out-dir $W/op21 2>&1 | grep -v Warn | tail -22; date
timeout 140 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --providers liger,tigon --timeout 65 --gpu $G --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -6; date
(cd $W && tar czf $OUT/s30c1.tgz .) && rm -rf $W
