# Session 22, call C (third of three; carry .peers/w and .peers/q2: the CuTe DSL runtime is whole from here on):
# issue 28's op table with QuACK and Liger's CuTe DSL backend: cross-entropy at 8192 x 128256 (goal 3: kernel time by
# CUDA-graph replays, host-inclusive by plain do_bench), rms_norm at 16384 x 4096 (goal 2: host-inclusive <= 1.2x
# kernel), and the host's issue cost per fwd + bwd call at the launch-bound sizes (goal 2):
#   bash benchmarks/results/h200/session22/s22cC.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
B="python3 -m tigon.cli bench --model llama3-8b --quiet"
timeout 80 $B --op cross_entropy --tokens 8192 --providers tigon,tigon_fwdgrad,liger,quack --cuda-graph \
  --json $W/bench-ce-graph_$G.json 2>&1 | grep -v Warn | tail -4
LIGER_KERNEL_IMPL=cutedsl timeout 45 $B --op cross_entropy --tokens 8192 --providers liger --cuda-graph \
  --json $W/bench-ce-cutedsl-graph_$G.json 2>&1 | grep -v Warn | tail -3
timeout 50 $B --op cross_entropy --tokens 8192 --providers tigon,liger,quack \
  --json $W/bench-ce-plain_$G.json 2>&1 | grep -v Warn | tail -4
LIGER_KERNEL_IMPL=cutedsl timeout 35 $B --op cross_entropy --tokens 8192 --providers liger \
  --json $W/bench-ce-cutedsl-plain_$G.json 2>&1 | grep -v Warn | tail -3
timeout 45 $B --op rms_norm --tokens 16384 --providers tigon,quack \
  --json $W/bench-rms-plain_$G.json 2>&1 | grep -v Warn | tail -3
timeout 90 python3 benchmarks/host_issue.py --ops rms_norm,swiglu --providers eager,tigon,liger,quack \
  --out $W/host-ops_$G.json 2>&1 | grep -v Warn | tail -16
LIGER_KERNEL_IMPL=cutedsl timeout 50 python3 benchmarks/host_issue.py --ops rms_norm,swiglu --providers liger \
  --out $W/host-ops-cutedsl_$G.json 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s22cC.tgz .) && rm -rf $W
