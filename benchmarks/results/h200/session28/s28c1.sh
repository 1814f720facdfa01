# Session 28, call 1 (carry .peers/w): session 27's call 1 reordered so that the row that matters most comes first
# (GPU starts were scarce: a call may be cut):
# - the Qwen2.5-VL-7B e2e row with the length-batched vision attention (issue 20: >= 1.15x HF eager; 1.05x on the
#   H100 in session 27 before it), HF, Tigon, Liger (about 250 s);
# - CUDA tests of session 27's changes (MoE experts' bounds, the glue's custom ops compiled, varlen attention);
# - issue 21's group_norm / sparsemax variants (benchmarks/issue21_tune.py);
# - the vision tower alone, per-window vs length-batched attention (benchmarks/varlen_attention_bench.py).
#   bash benchmarks/results/h200/session28/s28c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
PROVIDERS=original,tigon,liger bash benchmarks/results/h200/session22/s22c_moe.sh qwen2.5-vl-7b
W=$OUT/w; mkdir -p $W
timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_moe_experts.py \
  tests/test_varlen_attention.py tests/test_compile_without_custom_op.py "tests/test_compile.py::test_moe_glue_compile" \
  tests/test_vlm_tools.py > $W/pytest-c1.log 2>&1; echo "pytest rc $?"
grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c1.log | tail -6
timeout 60 python3 benchmarks/varlen_attention_bench.py --out $W/varlen-attention_$G.json 2>&1 | grep -v Warn | tail -4
timeout 130 python3 benchmarks/issue21_tune.py --out $W/issue21-tune_$G.json 2>&1 | grep -v Warn | tail -20
(cd $W && tar czf $OUT/s28c1.tgz .) && rm -rf $W
