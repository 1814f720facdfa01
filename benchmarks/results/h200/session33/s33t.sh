# Session 33's CUDA test call (any card; carry .peers/w for Liger; about 370 s): the files this session changed or
# added: Liger's keyword names on the ops (rms_norm X / W, ..., cross_entropy input), Liger's module attributes, the new
# nn.VocabParallelCrossEntropy, nn.FusedLinearJSDLoss on (B, T, H) inputs, DataParallel replicas (the two-GPU test
# runs only on a machine with 2+ cards), the LoRA compile note, no recompile on unpatch + patch, the numerics pass's
# files
#   bash benchmarks/results/h200/session33/s33t.sh
export PYTHONPATH=$PWD/src:$PWD/tests:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
timeout 260 python3 -m pytest -q -p no:cacheprovider -p no:logging --tb=short -rf tests/test_liger_signatures.py \
  tests/test_liger_options.py tests/test_vocab_parallel.py tests/test_fused_linear_jsd.py tests/test_patch_persist.py \
  tests/test_lora_qkv_rope.py tests/test_sparsemax.py tests/test_fused_linear_grpo.py \
  tests/test_act_linear.py tests/test_dyt.py tests/test_group_norm.py \
  tests/test_compile.py::test_patch_report_says_a_compiled_instance_forward_was_compiled_first \
  tests/test_compile_recompiles.py tests/test_causal_mask.py tests/test_trl_switch_peft.py tests/test_tiled_mlp.py \
  tests/test_checkpointing_autocast.py \
  -m "slow or not slow" \
  > $W/pytest-s33t.log 2>&1; echo "pytest rc $?"; grep -E "^FAILED|^ERROR|passed|failed" $W/pytest-s33t.log | tail -15
date
# sparsemax's kernel changed (NaN / inf rows, passes on x - max): its speed again, kernel time (CUDA graph) and
# host-inclusive, against the 0.239 ms / 94% of session 30 (H100)
timeout 60 python3 -m tigon.cli bench --op sparsemax --model llama3-8b --tokens 16384 --providers tigon,liger \
  --cuda-graph --quiet --json $W/bench-sparsemax-graph.json; echo "bench graph rc $?"
timeout 60 python3 -m tigon.cli bench --op sparsemax --model llama3-8b --tokens 16384 --providers tigon,liger \
  --quiet --json $W/bench-sparsemax.json; echo "bench rc $?"
date
(cd $W && tar czf $OUT/s33t.tgz .) && rm -rf $W
