# Session 26, call 5 (carry .peers/w): issue 24's prediction rows not yet run, Gemma-2-9B (4 layers) and the MoE row
# (Qwen3-30B-A3B shape, 4 layers), then Llama-3-8B again after session 25's host-wait fix (per-op prediction); the
# goal is +-7% on every row; about 560 s
#   bash benchmarks/results/h200/session26/s26c5.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 540 python3 benchmarks/predict_table.py --rows gemma2-9b,qwen3-30b-a3b,llama3-8b --timeout 175 --out-dir $W \
  2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s26c5.tgz .) && rm -rf $W
