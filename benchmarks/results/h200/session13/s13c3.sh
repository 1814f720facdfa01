# Session 13, call 3: post-training losses with gradients formed in the forward, Liger options, op variants,
# vocab-parallel loss; FLCE host probe.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -q -p no:cacheprovider -rfs -x tests/test_fused_linear_grpo.py tests/test_preference.py tests/test_fused_linear_jsd.py \
  tests/test_liger_options.py tests/test_rope_variants.py tests/test_clamped_swiglu.py tests/test_rms_norm_gated.py tests/test_vocab_parallel.py \
  > $OUT/pytest-c3.log 2>&1; echo "pytest rc $?"; tail -4 $OUT/pytest-c3.log
TIGON_FAMILY_ALL=1 timeout 70 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_families.py -k "glm or deepseek or gpt_oss or llama4 or qwen3_next or qwen3_5 or falcon_h1 or qwen2_vl or gemma4" >> $OUT/pytest-c3.log 2>&1; echo "families rc $?"; tail -4 $OUT/pytest-c3.log
timeout 130 python3 -m tigon.cli bench --op fused_linear_grpo,fused_linear_jsd,fused_linear_dpo_loss --model llama3-8b --tokens 8192 --providers eager,tigon,liger --quiet --json $OUT/bench-posttrain.json; echo "bench posttrain rc $?"
timeout 30 python3 .gpu/mul_probe.py > $OUT/mul-probe.txt 2>&1; echo "mul probe rc $?"; grep " us" $OUT/mul-probe.txt
timeout 90 python3 -m tigon.cli bench --op rope,rope_interleaved,mrope,clamped_swiglu,rms_norm_gated,tvd --model llama3-8b --tokens 8192 --providers eager,compile,tigon,liger --quiet --json $OUT/bench-variants.json; echo "bench variants rc $?"
