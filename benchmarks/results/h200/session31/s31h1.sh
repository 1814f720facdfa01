# Session 31, H200 call A (carry .peers/w): the CUDA tests of the kernel paths changed since the last H200 run, the two
# open CUDA failures diagnosed, then issue 21's op table on the card it names (its ten ops at Llama-3-8B sizes, the
# divergences at 8192 x 128256, kl_div with session 30's unbiased log) for Tigon, Liger (Triton) and torch.compile in
# both bases; about 520 s
#   bash benchmarks/results/h200/session31/s31h1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W/op21; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 120 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_fused_linear_logprobs.py \
  tests/test_divergence.py tests/test_moe_experts.py tests/test_sparsemax.py tests/test_preference.py \
  -m "slow or not slow" > $W/pytest-s31h1.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s31h1.log | tail -10; date
timeout 60 python3 benchmarks/results/h200/session30/diag_s30.py > $W/diag_s30.log 2>&1; echo "diag rc $?"
grep -v Warn $W/diag_s30.log | tail -24; date
OPS=group_norm,sparsemax,dyt,poly_norm,softmax,relu_squared,jsd,kl_div,tvd,tiled_mlp
timeout 320 python3 benchmarks/op_table.py --model llama3-8b --ops $OPS --tokens 16384,jsd=8192,kl_div=8192,tvd=8192 \
  --providers tigon,liger,compile --timeout 75 --gpu $G --out-dir $W/op21 2>&1 | grep -v Warn | tail -22; date
(cd $W && tar czf $OUT/s31h1.tgz .) && rm -rf $W
