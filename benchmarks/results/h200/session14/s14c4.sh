# Session 14, call 4: the merged branches on the GPU (kl_div formed in the forward, in_place fused_add_rms_norm /
# poly_norm, Liger's positional order, checkpointing policy, DPO reference folded into the policy loop, FLCE host
# cost, VLM tools), kl_div and the post-training losses' timing, group_norm's two-launch probe.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_divergence.py tests/test_poly_norm.py tests/test_dyt.py tests/test_fused_add_rms_norm.py \
  tests/test_liger_signatures.py tests/test_liger_coverage.py tests/test_checkpointing.py tests/test_preference.py tests/test_fused_linear_jsd.py \
  tests/test_vlm_tools.py > $OUT/pytest-c4.log 2>&1; echo "pytest rc $?"; tail -4 $OUT/pytest-c4.log
timeout 50 python3 -m tigon.cli bench --op kl_div --model llama3-8b --tokens 16384 --providers compile,tigon,liger --quiet --json $OUT/bench-kl_div-host_16k.json; echo "kl host rc $?"
timeout 35 python3 -m tigon.cli bench --op kl_div --model llama3-8b --tokens 16384 --providers compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-kl_div-graph_16k.json; echo "kl graph rc $?"
timeout 25 python3 .gpu/gn_probe.py > $OUT/gn-probe.txt 2>&1; echo "gn rc $?"; grep "group=" $OUT/gn-probe.txt
timeout 40 python3 benchmarks/host_issue.py --ops fused_linear_cross_entropy --providers eager,tigon --modules --out $OUT/host-flce-layer.json > $OUT/host-flce.txt 2>&1; echo "host rc $?"; tail -8 $OUT/host-flce.txt | cut -c1-200
timeout 120 python3 -m tigon.cli bench --op fused_linear_dpo_loss,fused_linear_jsd --model llama3-8b --tokens 8192 --providers tigon,tigon_1gib,liger --quiet --json $OUT/bench-posttrain_8k.json; echo "posttrain rc $?"
