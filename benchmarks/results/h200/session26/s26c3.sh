# Session 26, call 3 (carry .peers/w): the vision-language row of issue 20 (Qwen2.5-VL-7B shape, 4 layers, 4 x 2048
# with 512 image tokens a sequence; never run): HF eager, Tigon, Liger, HF + compile, each provider's last step
# profiled; about 500 s
#   bash benchmarks/results/h200/session26/s26c3.sh
PROVIDERS=original,tigon,liger,original_compile E2E_ARGS=--kernel-summary \
  bash benchmarks/results/h200/session22/s22c_moe.sh qwen2.5-vl-7b
