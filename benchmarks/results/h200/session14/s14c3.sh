# Session 14, call 3: the interleaved-rope fix (tests, kernel + host time); tune.py studies for dyt and group_norm;
# the rest of Liger's list (jsd, tvd, softmax, sparsemax, relu_squared) at 16384 x 4096 / x 128256.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfs -x tests/test_rope_variants.py tests/test_rope.py > $OUT/pytest-c3.log 2>&1; echo "pytest rc $?"; tail -2 $OUT/pytest-c3.log
timeout 60 python3 -m tigon.cli bench --op rope,rope_interleaved,mrope --model llama3-8b --tokens 8192 --providers eager,compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-rope-variants-graph_8k.json; echo "rope graph rc $?"
timeout 50 python3 -m tigon.cli bench --op rope,rope_interleaved,mrope --model llama3-8b --tokens 8192 --providers eager,compile,tigon,liger --quiet --json $OUT/bench-rope-variants-host_8k.json; echo "rope host rc $?"
timeout 170 python3 benchmarks/tune.py --out $OUT/tune_dyt-group_norm_llama3-8b_h200_20261204.json --ops dyt,group_norm --budget-s 150 > $OUT/tune.log 2>&1; echo "tune rc $?"; tail -4 $OUT/tune.log
OPS=softmax,sparsemax,relu_squared,tvd,jsd
timeout 130 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers eager,compile,tigon,liger --quiet --json $OUT/bench-liger-ops2-host_16k.json; echo "bench host rc $?"
timeout 100 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-liger-ops2-graph_16k.json; echo "bench graph rc $?"
