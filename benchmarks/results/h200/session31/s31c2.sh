# Session 31, call 2 (any card; carry .peers/w): issue 24's prediction rows with session 30's unheld host measurement,
# one fresh process per row (predicted vs measured patched step, tigon profile); about 580 s
#   ROWS=qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b bash benchmarks/results/h200/session31/s31c2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 570 python3 benchmarks/predict_table.py --rows ${ROWS:-qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b} \
  --timeout 140 --out-dir $W/pred 2>&1 | grep -v Warn | tail -16; date
(cd $W && tar czf $OUT/s31c2.tgz .) && rm -rf $W
