# Session 25, call 3 (carry .peers/w), for the next GPU session: issue 26's rows still owed (goal on the H200:
# >= 1.10x Liger and >= 1.25x HF, peak no higher than Liger's): Llama-3.2-1B, all 16 layers, no checkpointing
# (1.096x Liger on an H100 in session 21), and Llama-3-8B, all 32 layers, HF's non-reentrant checkpointing against
# Tigon's selective checkpointing at its automatic budget (1.09x Liger at an older budget rule in session 16); ~480 s
#   bash benchmarks/results/h200/session25/s25c3.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 200 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --providers original,liger,tigon --timeout 60 --gpu $G --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -6
timeout 330 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 4 --warmup 2 \
  --gradient-checkpointing non_reentrant --providers liger,tigon,tigon_sac --timeout 105 --gpu $G \
  --out-dir $W/e2e-8b-ckpt 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s25c3.tgz .) && rm -rf $W
