# Session 23, call 2 (carry .peers/w and .peers/q1): issue 28 goal 4's end-to-end rows in memory="low" (tigon_low:
# the fused LM-head loss's exact sliced plan) against Tigon's default and Liger, 4 layers, 4 x 2048 tokens
#   bash benchmarks/results/h200/session23/s23c2.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
for M in llama3-8b qwen2-7b gemma2-9b; do
  timeout 170 python3 benchmarks/e2e_table.py --model $M --layers 4 --batch-size 4 --seq-len 2048 --steps 8 \
    --warmup 3 --providers tigon,tigon_low,liger --timeout 55 --out-dir $W/$M 2>&1 | grep -v Warn | tail -9
done
(cd $W && tar czf $OUT/s23c2.tgz .) && rm -rf $W
