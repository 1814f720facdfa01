# Session 23, call 4 (carry .peers/w and .peers/q2, right after call 3 on the same machine): the op table's other
# providers beside Tigon again (merged with call 3's by `op_table.py --from-dir optable`), and the per-call host cost
# at launch-bound sizes (issue 28 goal 2), Liger's CuTe DSL backend in its own process
#   bash benchmarks/results/h200/session23/s23c4.sh
source benchmarks/results/h200/session22/peers3.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
timeout 300 python3 benchmarks/op_table.py --model llama3-8b --gpu h200 --providers liger,compile,eager,tigon \
  --timeout 120,compile=170 --out-dir $W 2>&1 | grep -v Warn | grep -A30 "^### fwd_bwd"
timeout 100 python3 benchmarks/host_issue.py --ops rms_norm,swiglu,fused_add_rms_norm --providers eager,tigon,liger,quack \
  --out $W/host-ops_h200.json 2>&1 | grep -v Warn | tail -12
LIGER_KERNEL_IMPL=cutedsl timeout 60 python3 benchmarks/host_issue.py --ops rms_norm,swiglu,fused_add_rms_norm \
  --providers liger --out $W/host-ops-liger-cutedsl_h200.json 2>&1 | grep -v Warn | tail -6
(cd $W && tar czf $OUT/s23c4.tgz .)
