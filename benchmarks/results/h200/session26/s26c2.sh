# Session 26, call 2 (carry .peers/w), issue 20's GPT-OSS row with this session's MoE glue and session 25's sink
# attention, both new on a GPU:
# - CUDA tests of the MoE glue ops and experts forward (tigon.kernels.moe_glue, integrations.moe_experts) and of the
#   sink attention (integrations.sink_attention);
# - one experts layer fwd + bwd, HF grouped_mm vs Tigon's gate hook vs the glue (benchmarks/moe_glue_bench.py:
#   OLMoE-1B-7B and GPT-OSS-20B shapes, 8192 tokens); one attention layer with sinks, SDPA vs eager
#   (sink_attention_bench.py);
# - the GPT-OSS-20B-shape e2e row, HF eager, Tigon, Liger, each last step profiled (goal >= 1.15x HF eager, >= Liger,
#   peak <= Liger's; session 25 on an H100: 1.12x HF, 1.04x Liger; HF + compile 29,573 tok/s there); about 480 s
#   bash benchmarks/results/h200/session26/s26c2.sh
bash benchmarks/results/h200/session26/s26c2a.sh   # the tests and layer benches (-> $OUT/s26c2a.tgz)
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
PROVIDERS=original,tigon,liger E2E_ARGS=--kernel-summary bash benchmarks/results/h200/session22/s22c_moe.sh gpt-oss-20b
