# Session 18, call 1 (H200): session 17's CUDA fixes re-run (jsd series, compiled post-training losses, TRL switch
# under accelerate's mixed precision), the checkpointing test's attention ops on CUDA, profile's prediction per part
# (issue 24), the compiled post-training losses (issue 29).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader
timeout 40 python3 .gpu/ckpt_diag.py > $W/ckpt_diag.log 2>&1; grep -v Warn $W/ckpt_diag.log | tail -7 | cut -c1-400
timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_divergence.py tests/test_fused_linear_jsd.py tests/test_compile_posttrain.py > $W/pytest-div-post.log 2>&1; echo "div/post rc $?"; grep -E "^FAILED|passed|failed" $W/pytest-div-post.log | tail -10 | cut -c1-300
timeout 50 python3 -m tigon.cli bench --op fused_linear_grpo,fused_linear_dpo_loss --model llama3-8b --tokens 8192 --providers eager,compile,tigon,tigon_compile --quiet --json $W/bench-posttrain-compile_llama3-8b-8k.json > $W/bench-posttrain.log 2>&1; echo "posttrain bench rc $?"; grep -v Warn $W/bench-posttrain.log | tail -14 | cut -c1-200
timeout 110 python3 benchmarks/predict_table.py --rows qwen2.5-0.5b --timeout 105 --out-dir $W/predict 2>&1 | grep -v Warn | tail -8
(cd $W && tar czf $OUT/s18c1.tgz .) && rm -rf $W
