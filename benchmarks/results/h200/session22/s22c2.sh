# Session 22, call 2: the checkpointed full-depth Llama-3-8B step of Liger and Tigon with a kernel summary (issue 26). Carry .peers/w:
#   bash benchmarks/results/h200/session22/s22c2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
timeout 560 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 4 --warmup 2 \
  --gradient-checkpointing non_reentrant --kernel-summary --timeout 200 --gpu $G --providers liger,tigon \
  --out-dir $W/e2e-8b-ckpt-summary 2>&1 | grep -v Warn | tail -60
(cd $W && tar czf $OUT/s22c2.tgz .) && rm -rf $W
