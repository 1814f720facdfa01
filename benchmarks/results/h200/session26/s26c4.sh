# Session 26, call 4 (carry .peers/w): issue 26's third full-depth row, Qwen2.5-7B, all 28 layers, HF's non-reentrant
# checkpointing: HF, Liger, Tigon with its selective checkpointing at the automatic budget (goal: >= 1.10x Liger and
# >= 1.25x HF, peak no higher than Liger's); about 420 s
#   bash benchmarks/results/h200/session26/s26c4.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 420 python3 benchmarks/e2e_table.py --model qwen2.5-7b --batch-size 4 --seq-len 2048 --steps 4 --warmup 2 \
  --gradient-checkpointing non_reentrant --providers original,liger,tigon_sac --timeout 125 --gpu $G \
  --out-dir $W/e2e-qwen7b-ckpt 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s26c4.tgz .) && rm -rf $W
