# Session 31, H200 call B (carry .peers/w): issue 26's full-depth rows at the current code (goal: >= 1.10x Liger and
# >= 1.25x HF, peak no higher than Liger's): Llama-3.2-1B, all 16 layers, no checkpointing (HF, Liger, Tigon), and
# Llama-3-8B, all 32 layers, HF's non-reentrant checkpointing (HF, Liger, Tigon, Tigon's selective checkpointing at
# its automatic budget); one process per provider; about 560 s
#   bash benchmarks/results/h200/session31/s31h2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 180 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --providers original,liger,tigon --timeout 55 --gpu $G --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -6; date
timeout 390 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 4 --warmup 2 \
  --gradient-checkpointing non_reentrant --providers original,liger,tigon,tigon_sac --timeout 95 --gpu $G \
  --out-dir $W/e2e-8b-ckpt 2>&1 | grep -v Warn | tail -8; date
(cd $W && tar czf $OUT/s31h2.tgz .) && rm -rf $W
