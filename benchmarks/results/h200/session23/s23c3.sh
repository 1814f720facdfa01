# Session 23, call 3 (carry .peers/w and .peers/q2; the CuTe DSL runtime complete): issue 28's op table with QuACK
# and Liger's CuTe DSL backend (goals 2, 3, 5) beside Tigon, both time bases (the other providers: a later call)
#   bash benchmarks/results/h200/session23/s23c3.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
timeout 560 python3 benchmarks/op_table.py --model llama3-8b --gpu $G --providers quack,liger_cutedsl,tigon \
  --timeout 170 --out-dir $W \
  2>&1 | grep -v Warn | tail -40
(cd $W && tar czf $OUT/s23c3.tgz .) && rm -rf $W
