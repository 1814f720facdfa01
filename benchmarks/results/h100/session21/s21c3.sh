# Session 21, call 3: Llama-3-8B shape (4 layers, 4 x 2048) and SmolLM2-360M (8 x 2048) bf16 with every provider,
# eager and compiled (issues 26 / 28). Run from the repository root, carry .peers/w:
#   bash benchmarks/results/h100/session21/s21c3.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 python3 benchmarks/e2e_table.py --model llama3-8b --layers 4 --batch-size 4 --seq-len 2048 --steps 8 \
  --warmup 3 --timeout 62 --gpu $G --providers original,original_compile,liger,tigon,tigon_compile --out-dir $W/e2e-8b-4l \
  2>&1 | grep -v Warn | tail -9
timeout 230 python3 benchmarks/e2e_table.py --model smollm2-360m --batch-size 8 --seq-len 2048 --steps 10 --warmup 3 \
  --timeout 45 --gpu $G --providers original,original_compile,liger,tigon,tigon_compile --out-dir $W/e2e-smollm2 \
  2>&1 | grep -v Warn | tail -9
(cd $W && tar czf $OUT/s21c3.tgz .) && rm -rf $W
