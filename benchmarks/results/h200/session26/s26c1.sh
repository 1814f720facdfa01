# Session 26, call 1 (carry .peers/w): issue 26's full-depth rows (goal: >= 1.10x Liger and >= 1.25x HF, peak no
# higher than Liger's). Llama-3.2-1B, all 16 layers, no checkpointing (session 21 on an H100: Tigon 1.095x Liger at
# 17.30 GiB against Liger's 16.92), with tigon_lean (bf16 dW accumulation in the LM-head loss: about 0.5 GiB less at
# the tied 128256 x 2048 head); Llama-3-8B, all 32 layers, HF's non-reentrant checkpointing against Tigon's
# selective checkpointing at its automatic budget; about 520 s
#   bash benchmarks/results/h200/session26/s26c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 230 python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 2048 --steps 8 --warmup 3 \
  --providers original,liger,tigon,tigon_lean --timeout 55 --gpu $G --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -7
timeout 320 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 4 --warmup 2 \
  --gradient-checkpointing non_reentrant --providers liger,tigon,tigon_sac --timeout 100 --gpu $G \
  --out-dir $W/e2e-8b-ckpt 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s26c1.tgz .) && rm -rf $W
