# Session 22, call 1: profile's predicted vs measured patched step on four rows (issue 24), then the checkpointed
# full-depth Llama-3-8B step of Liger and Tigon with a kernel summary (issue 26). Carry .peers/w:
#   bash benchmarks/results/h100/session22/s22c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
timeout 385 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b --timeout 120 \
  --out-dir $W/predict 2>&1 | grep -v Warn | tail -30
timeout 190 python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --steps 3 --warmup 1 \
  --gradient-checkpointing non_reentrant --kernel-summary --timeout 92 --gpu $G --providers liger,tigon \
  --out-dir $W/e2e-8b-ckpt-summary 2>&1 | grep -v Warn | tail -60
(cd $W && tar czf $OUT/s22c1.tgz .) && rm -rf $W
