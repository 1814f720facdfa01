# Session 17, call 2 (H100, warm): direct launching on / off on Qwen2.5-0.5B, the e2e DPO row, clamped SwiGLU bench.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
for d in 1 0; do TIGON_DIRECT_LAUNCH=$d timeout 40 python3 -m tigon.cli bench --e2e --model qwen2.5-0.5b --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 --providers original,tigon --quiet --json $OUT/e2e-qwen0.5b-direct$d.json 2>&1 | grep -v Warn | tail -2; done
timeout 40 python3 -m tigon.cli bench --op clamped_swiglu --model llama3-8b --tokens 8192 --providers tigon,compile --cuda-graph --quiet --json $OUT/bench-clamped-graph_llama3-8b-8k.json; echo "clamped rc $?"
eval "$(sh .wheels/trl/install.sh 2>/dev/null)"; export PYTHONPATH=$PWD/src:$PYTHONPATH
for p in hf liger tigon; do timeout 60 python3 benchmarks/dpo_e2e.py --provider $p --steps 10 --warmup 3 --out $OUT/dpo-e2e-${p}_llama3-8b-4l_h100_20261205.json 2>&1 | grep -v Warn | tail -2; done
python3 benchmarks/dpo_e2e.py --table $OUT 2>&1 | tail -6
