# Session 14, call 1: issue 21's remaining ops against the bar (group_norm, dyt, kl_div, poly_norm and the rest of
# Liger's list) at 16384 x 4096, host-inclusive and CUDA-graph kernel time; variants' kernel time; direct launcher tests.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfs --durations=5 tests/test_group_norm.py tests/test_dyt.py tests/test_poly_norm.py \
  tests/test_divergence.py tests/test_softmax.py tests/test_relu_squared.py tests/test_sparsemax.py > $OUT/pytest-c1.log 2>&1; echo "pytest rc $?"; tail -3 $OUT/pytest-c1.log
OPS=group_norm,dyt,poly_norm,kl_div,jsd,tvd,softmax,sparsemax,relu_squared
timeout 120 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers eager,compile,tigon,liger --quiet --json $OUT/bench-liger-ops-host_16k.json; echo "bench host rc $?"
timeout 120 python3 -m tigon.cli bench --op $OPS --model llama3-8b --tokens 16384 --providers eager,compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-liger-ops-graph_16k.json; echo "bench graph rc $?"
timeout 90 python3 -m tigon.cli bench --op rope_interleaved,mrope,clamped_swiglu,rms_norm_gated --model llama3-8b --tokens 8192 --providers eager,compile,tigon --cuda-graph --quiet --json $OUT/bench-variants-graph_8k.json; echo "bench variants rc $?"
TIGON_DIRECT_LAUNCH=1 timeout 60 python3 -m pytest -q -p no:cacheprovider -rfs -x tests/test_host_launch.py tests/test_glu.py tests/test_rms_norm.py > $OUT/pytest-direct.log 2>&1; echo "pytest direct rc $?"; tail -3 $OUT/pytest-direct.log
