# Session 26, call 2 (carry .peers/w): GPT-OSS's attention with sinks through SDPA (session 25's
# tigon.integrations.sink_attention, never run on a GPU): its CUDA tests, one layer against eager, then the
# GPT-OSS-20B-shape e2e row (issue 20: >= 1.15x HF eager and >= Liger at peak <= Liger's; session 25 on an H100:
# 1.12x HF, 1.04x Liger without it), with HF + compile but not Tigon + compile (device time), each provider's
# last step profiled (kernels by kind: where the MoE glue's time goes); about 480 s
#   bash benchmarks/results/h200/session26/s26c2.sh
PROVIDERS=original,tigon,liger,original_compile E2E_ARGS=--kernel-summary bash benchmarks/results/h200/session25/s25c2.sh
