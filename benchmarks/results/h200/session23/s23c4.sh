# Session 23, call 4 (carry .peers/w): tigon profile's predicted vs measured patched step (issue 24)
#   bash benchmarks/results/h200/session23/s23c4.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
timeout 560 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b --timeout 135 \
  --out-dir $W 2>&1 | grep -v Warn | tail -30
(cd $W && tar czf $OUT/s23c4.tgz .) && rm -rf $W
