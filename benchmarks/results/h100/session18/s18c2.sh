# Session 18, call 2: the CUDA fixes of call 1 (JSD_NEAR as tl.constexpr; the checkpointing test's heads), the
# TRL switch on CUDA, the e2e DPO row (issue 29).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_kernel_globals.py tests/test_divergence.py tests/test_fused_linear_jsd.py tests/test_compile_posttrain.py tests/test_checkpointing.py > $W/pytest-c2.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|passed|failed" $W/pytest-c2.log | tail -10 | cut -c1-300
eval "$(sh .wheels/trl/install.sh 2>/dev/null)"; export PYTHONPATH=$PWD/src:$PYTHONPATH
timeout 70 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_trl_switch.py > $W/pytest-trl.log 2>&1; echo "trl rc $?"; grep -E "^FAILED|passed|failed" $W/pytest-trl.log | tail -5 | cut -c1-300
for p in hf liger tigon; do timeout 75 python3 benchmarks/dpo_e2e.py --provider $p --steps 8 --warmup 3 --out $W/dpo-e2e-${p}_llama3-8b-4l_h100_20261205.json > $W/dpo-$p.log 2>&1; echo "dpo $p rc $?"; grep -v Warn $W/dpo-$p.log | tail -2 | cut -c1-300; done
python3 benchmarks/dpo_e2e.py --table $W 2>&1 | tail -6
(cd $W && tar czf $OUT/s18c2.tgz .) && rm -rf $W
