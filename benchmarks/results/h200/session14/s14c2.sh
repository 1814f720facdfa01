# Session 14, call 2: issue 21's bar for group_norm, dyt, poly_norm, kl_div at 16384 x 4096 (host-inclusive and
# CUDA-graph kernel time, eager / compile / Tigon / Liger); rope variants' kernel time (the view-leaf fix).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
OPS=group_norm,dyt,poly_norm,kl_div
timeout 170 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers eager,compile,tigon,liger --quiet --json $OUT/bench-liger-ops-host_16k.json; echo "bench host rc $?"
timeout 150 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers eager,compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-liger-ops-graph_16k.json; echo "bench graph rc $?"
timeout 80 python3 -m tigon.cli bench --op rope,rope_interleaved,mrope --model llama3-8b --tokens 8192 --providers eager,compile,tigon --cuda-graph --quiet --json $OUT/bench-rope-variants-graph_8k.json; echo "bench rope graph rc $?"
