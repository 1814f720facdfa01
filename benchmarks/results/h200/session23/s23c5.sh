# Session 23, call 5 (no carry; run 6 the same with --rows llama3-8b,qwen2-7b --timeout 115: both timed out): tigon profile's predicted vs measured patched step (issue 24)
#   bash benchmarks/results/h200/session23/s23c5.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
timeout 330 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b --timeout 160 \
  --out-dir $W 2>&1 | grep -v Warn | tail -30
(cd $W && tar czf $OUT/s23c5.tgz .) && rm -rf $W
