# Session 13, call 2: LoRA gated-MLP fusion (tests, op bench, e2e), frozen-head chunks, FLCE host cost, rest of call 1's tests.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 100 python3 -m pytest -q -x -p no:cacheprovider -rfs tests/test_lora_mlp.py tests/test_lora.py tests/test_peft_trainer.py tests/test_trl_switch.py > $OUT/pytest-lora.log 2>&1; echo "pytest lora rc $?"; tail -3 $OUT/pytest-lora.log
timeout 110 python3 -m pytest -q -x -p no:cacheprovider -rfs tests/test_fused_linear_cross_entropy.py tests/test_rms_norm.py tests/test_rope.py tests/test_profile_attrib.py tests/test_large_offsets.py >> $OUT/pytest-lora.log 2>&1; echo "pytest rest rc $?"; tail -3 $OUT/pytest-lora.log
TIGON_FAMILY_ALL=1 timeout 50 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_families.py -k gemma4 >> $OUT/pytest-lora.log 2>&1; echo "families gemma4 rc $?"; tail -2 $OUT/pytest-lora.log
timeout 60 python3 .gpu/flce_host.py > $OUT/flce-host.txt 2>&1; echo "flce host rc $?"; grep "issue ms" $OUT/flce-host.txt
timeout 60 python3 .gpu/frozen_ab.py > $OUT/frozen-head-chunks.json; echo "frozen rc $?"; cat $OUT/frozen-head-chunks.json
timeout 60 python3 -m tigon.cli bench --op lora_glu_mlp,lora_linear --model llama3-8b --tokens 4096 --providers eager,compile,tigon --quiet --json $OUT/bench-lora-ops.json; echo "bench lora rc $?"
timeout 300 python3 benchmarks/e2e_table.py --model llama3-8b --layers 8 --lora 16 --batch-size 2 --seq-len 2048 --steps 8 --warmup 2 --timeout 90 --providers original,liger,tigon --out-dir $OUT/lora > /tmp/e2e-lora.txt 2>&1; echo "e2e rc $?"; tail -25 /tmp/e2e-lora.txt
