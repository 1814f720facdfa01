# Session 29: several of issue 20's rows in one device call (`session22/s22c_moe.sh` per row, default providers:
# HF eager, Tigon, Liger, HF + compile, Tigon + compile), each row given what is left of a 570 s budget (a row is
# skipped when under 100 s remain). Carry .peers/w. Session 27's H100 calls took 111 s (OLMoE, five providers) and
# 213 s (Qwen2.5-VL, four), so the cheap rows go first:
#   bash benchmarks/results/h200/session29/s29_rows.sh olmoe-1b-7b qwen2.5-vl-7b
#   bash benchmarks/results/h200/session29/s29_rows.sh gpt-oss-20b
T0=$(date +%s)
for ROW in "$@"; do
  LEFT=$((570 - $(date +%s) + T0))
  if [ $LEFT -lt 100 ]; then echo "skipped $ROW: ${LEFT} s left"; continue; fi
  echo "== $ROW (${LEFT} s left)"
  ROW_TIMEOUT=$LEFT bash benchmarks/results/h200/session22/s22c_moe.sh $ROW
  echo "== $ROW took $(( $(date +%s) - T0 )) s since the call's start"
done
