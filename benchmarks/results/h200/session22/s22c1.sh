# Session 22, call 1: profile's predicted vs measured patched step on four rows (issue 24). Carry .peers/w:
#   bash benchmarks/results/h200/session22/s22c1.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
timeout 560 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b --timeout 135 \
  --out-dir $W/predict 2>&1 | grep -v Warn | tail -30
(cd $W && tar czf $OUT/s22c1.tgz .) && rm -rf $W
