# Session 20, call 3: Llama-3-8B (4 layers, 4 x 2048) compiled with the packed-mask fix (issue 28 goal 1), and
# profile's predicted-vs-measured table for four rows (issue 24).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 python3 benchmarks/e2e_table.py --steps 8 --warmup 3 --gpu $G --model llama3-8b --layers 4 --batch-size 4 --seq-len 2048 \
  --timeout 70 --providers original_compile,tigon_compile --out-dir $W/e2e-8b-4l 2>&1 | grep -v Warn | tail -6
timeout 380 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b,llama3.2-1b,llama3-8b,qwen2-7b --steps 5 --warmup 2 --timeout 90 --out-dir $W/predict 2>&1 | grep -v Warn | tail -12 | cut -c1-250
(cd $W && tar czf $OUT/s20c3.tgz .) && rm -rf $W
