# Session 21, call 5: Llama-3-8B at full depth (32 layers, 4 x 2048) under HF's gradient checkpointing, eager:
# Liger and Tigon (issue 26's row; HF + compile and Tigon + compile are call 4's). Carry .peers/w:
#   bash benchmarks/results/h100/session21/s21c5.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 215 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 5 --warmup 2 \
  --gradient-checkpointing non_reentrant --timeout 105 --gpu $G --providers liger,tigon \
  --out-dir $W/e2e-8b-full-ckpt-eager 2>&1 | grep -v Warn | tail -5
(cd $W && tar czf $OUT/s21c5.tgz .) && rm -rf $W
