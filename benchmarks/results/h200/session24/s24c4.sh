# Session 24, call 4 (no carry): issue 24's prediction rows at 8B / 7B shapes, 4 layers (115 s a row was too short in
# session 23's call 6)
#   bash benchmarks/results/h200/session24/s24c4.sh
export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1; W=$OUT/w; mkdir -p $W
timeout 560 python3 benchmarks/predict_table.py --rows llama3-8b,qwen2-7b --timeout 270 --out-dir $W 2>&1 \
  | grep -v Warn | tail -6
(cd $W && tar czf $OUT/s24c4.tgz .) && rm -rf $W
