# Session 26, call 2a (carry .peers/w): the first half of s26c2.sh (its tests and the two layer benches, no e2e row), for
# a short device window; about 260 s
# - CUDA tests of the MoE glue ops and experts forward (tigon.kernels.moe_glue, integrations.moe_experts) and of the
#   sink attention (integrations.sink_attention);
# - one experts layer fwd + bwd, HF grouped_mm vs Tigon's gate hook vs the glue (benchmarks/moe_glue_bench.py:
#   OLMoE-1B-7B and GPT-OSS-20B shapes, 8192 tokens); one attention layer with sinks, SDPA vs eager
#   (sink_attention_bench.py);
# - the GPT-OSS-20B-shape e2e row, HF eager, Tigon, Liger, each last step profiled (goal >= 1.15x HF eager, >= Liger,
#   peak <= Liger's; session 25 on an H100: 1.12x HF, 1.04x Liger; HF + compile 29,573 tok/s there); about 480 s
#   bash benchmarks/results/h200/session26/s26c2a.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 140 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_moe_glue.py \
  tests/test_moe_experts.py tests/test_sink_attention.py \
  "tests/test_large_offsets.py::test_moe_expert_gate_past_2_31_elements" \
  "tests/test_large_offsets.py::test_moe_gather_and_combine_past_2_31_elements" \
  > $W/pytest-c2.log 2>&1; echo "pytest rc $?"
grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c2.log | tail -6
timeout 70 python3 benchmarks/moe_glue_bench.py --out $W/moe-glue_$G.json 2>&1 | grep -v Warn | tail -10
timeout 50 python3 benchmarks/sink_attention_bench.py --out $W/sink-attention_$G.json 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s26c2a.tgz .) && rm -rf $W
