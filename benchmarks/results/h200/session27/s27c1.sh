# Session 27, call 1 (carry .peers/w), about 400 s:
# - CUDA tests of session 27's changes: the MoE experts tests' fixed bounds (the H100 run of s26c2 failed 4 of them:
#   the tests' faults) and their compiled steps through the glue's new custom ops, the glue ops compiled one by one
#   (Inductor on CUDA), the vision towers' length-batched attention, ops without a custom op under compile;
# - issue 21's group_norm / sparsemax variants against the copy ceiling (benchmarks/issue21_tune.py, about 90 s);
# - the Qwen2.5-VL-7B vision tower alone, HF's per-window attention vs Tigon's varlen_attention
#   (benchmarks/varlen_attention_bench.py: attention calls, aten ops and fwd + bwd ms at 4 x 512 image tokens);
# - the Qwen2.5-VL-7B e2e row again (issue 20: >= 1.15x HF eager; 1.05x on the H100 in session 27 before the patch).
#   bash benchmarks/results/h200/session27/s27c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_moe_experts.py \
  tests/test_varlen_attention.py tests/test_compile_without_custom_op.py "tests/test_compile.py::test_moe_glue_compile" \
  > $W/pytest-c1.log 2>&1; echo "pytest rc $?"
grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c1.log | tail -6
timeout 130 python3 benchmarks/issue21_tune.py --out $W/issue21-tune_$G.json 2>&1 | grep -v Warn | tail -20
timeout 60 python3 benchmarks/varlen_attention_bench.py --out $W/varlen-attention_$G.json 2>&1 | grep -v Warn | tail -4
(cd $W && tar czf $OUT/s27c1.tgz .) && rm -rf $W
PROVIDERS=original,tigon,liger bash benchmarks/results/h200/session22/s22c_moe.sh qwen2.5-vl-7b
