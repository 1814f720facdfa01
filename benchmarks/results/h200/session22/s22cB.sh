# Session 22, call B (second of three; carry .peers/w and .peers/q1): sparsemax's new forward against the old one
# and the launch study of dyt / poly_norm / group_norm's new backward kernels (issue 21), then tigon bench's sparsemax
# row with Liger:
#   bash benchmarks/results/h200/session22/s22cB.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 100 python3 benchmarks/sparsemax_tune.py --out $W/sparsemax-tune_$G.json 2>&1 | grep -v Warn | tail -20
timeout 170 python3 benchmarks/tune.py --ops dyt,poly_norm,group_norm --peers '' --budget-s 150 \
  --out $W/tune-norms_llama3-8b-16k_$G.json 2>&1 | grep -v Warn | tail -45
timeout 60 python3 -m tigon.cli bench --op sparsemax --model llama3-8b --tokens 16384 --providers tigon,liger \
  --cuda-graph --quiet --json $W/bench-sparsemax-graph_$G.json 2>&1 | grep -v Warn | tail -4
(cd $W && tar czf $OUT/s22cB.tgz .) && rm -rf $W
