# Session 21, call 6 (the last ~260 s of device time): Llama-3-8B shape, 8 layers, PEFT LoRA r=16 on all seven
# projections, 2 x 2048, HF + PEFT, + Liger, + Tigon (issue 25's row, after sessions 19-20's host cuts). Carry .peers/w:
#   bash benchmarks/results/h100/session21/s21c6.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 140 python3 benchmarks/e2e_table.py --model llama3-8b --layers 8 --lora 16 --batch-size 2 --seq-len 2048 \
  --steps 8 --warmup 2 --timeout 45 --gpu $G --providers original,liger,tigon --out-dir $W/e2e-lora-8l 2>&1 | grep -v Warn | tail -5
(cd $W && tar czf $OUT/s21c6.tgz .) && rm -rf $W
