# Session 21, call 4: the compiled rows call 3 could not finish: SmolLM2-360M (8 x 2048) HF + compile and Tigon +
# compile with a longer per-provider limit, and Llama-3-8B at full depth (32 layers, 4 x 2048) under HF's gradient
# checkpointing, HF + compile and Tigon + compile (issues 26 / 28). Run from the repository root, carry .peers/w:
#   bash benchmarks/results/h100/session21/s21c4.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 benchmarks/e2e_table.py --model smollm2-360m --batch-size 8 --seq-len 2048 --steps 8 --warmup 3 \
  --timeout 98 --gpu $G --providers original_compile,tigon_compile --out-dir $W/e2e-smollm2-compile \
  2>&1 | grep -v Warn | tail -5
timeout 290 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 5 --warmup 2 \
  --gradient-checkpointing non_reentrant --timeout 143 --gpu $G --providers original_compile,tigon_compile \
  --out-dir $W/e2e-8b-full-ckpt-compile 2>&1 | grep -v Warn | tail -5
(cd $W && tar czf $OUT/s21c4.tgz .) && rm -rf $W
