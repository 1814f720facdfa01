# Session 24, call 3 (carry .peers/w; add liger_cutedsl to --providers after the three-call CuTe DSL sequence of
# session22/peers3.sh): an e2e Llama-3-8B row, 4 layers, 4 x 2048, beside HF, HF + torch.compile and Liger, each
# provider its own process: the per-call sync of the ignored-rows check must cost nothing measurable, and memory="low"
# against issue 28 goal 4's 1.10x Liger
#   bash benchmarks/results/h200/session24/s24c3.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
timeout 560 python3 benchmarks/e2e_table.py --model llama3-8b --layers 4 --batch-size 4 --seq-len 2048 --steps 8 \
  --warmup 3 --providers original,original_compile,tigon,tigon_low,liger --timeout 70,original_compile=150 \
  --out-dir $W 2>&1 | grep -v Warn | tail -9
(cd $W && tar czf $OUT/s24c3.tgz .) && rm -rf $W
