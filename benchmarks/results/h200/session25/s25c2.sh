# Session 25, call 2 (carry .peers/w), for the next GPU session: GPT-OSS's attention with sinks through SDPA
# (tigon.integrations.sink_attention, new in session 25, on by default for GPT-OSS; never run on a GPU): its CUDA
# tests, one layer against transformers' eager attention (benchmarks/sink_attention_bench.py: time, peak, the
# backend SDPA takes), then the GPT-OSS-20B-shape e2e row again (issue 20: Tigon 1.12x HF eager on an H100 in
# session 25 without it, goal >= 1.15x); about 330 s
#   bash benchmarks/results/h200/session25/s25c2.sh
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1
timeout 60 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_sink_attention.py \
  > $W/pytest-sink.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-sink.log | tail -4
timeout 60 python3 benchmarks/sink_attention_bench.py --out $W/sink-attention_$G.json 2>&1 | grep -v Warn | tail -12
(cd $W && tar czf $OUT/s25c2.tgz .) && rm -rf $W
bash benchmarks/results/h200/session22/s22c_moe.sh gpt-oss-20b 2>&1 | tail -14
