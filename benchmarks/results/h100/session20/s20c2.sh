# Session 20, call 2 (the device time left after many failed starts: about 200 s): the CUDA tests of the
# causal-mask wrapper, the host cuts' launch paths and gradient ownership, act_linear's fixed tests; Llama-3.2-1B
# (16 layers, 4 x 2048) compiled with the packed-sequence wrapper, HF + compile in the same run (issues 26 / 28).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 55 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_causal_mask.py tests/test_host_launch.py tests/test_grad_ownership.py tests/test_act_linear.py > $W/pytest-c2.log 2>&1
echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-c2.log | tail -8 | cut -c1-300
timeout 110 python3 benchmarks/e2e_table.py --steps 10 --warmup 3 --gpu $G --model llama3.2-1b --batch-size 4 --seq-len 2048 --timeout 54 --providers original_compile,tigon_compile --out-dir $W/e2e-1b 2>&1 | grep -v Warn | tail -6
(cd $W && tar czf $OUT/s20c2.tgz .) && rm -rf $W
