# Session 13, call 1: GPU checks of last session's merged-but-unrun work, CE default timing, profile attribution.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
set -x
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
git log --oneline -1 > $OUT/commit.txt 2>/dev/null || true
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfs --durations=8 tests/test_group_norm.py tests/test_sparsemax.py \
  tests/test_liger_options.py tests/test_cross_entropy.py tests/test_fused_linear_cross_entropy.py tests/test_rms_norm.py \
  tests/test_rope.py tests/test_profile_attrib.py tests/test_large_offsets.py > $OUT/pytest-newops.log 2>&1; echo "pytest rc $?"
tail -5 $OUT/pytest-newops.log
TIGON_FAMILY_ALL=1 timeout 90 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_families.py > $OUT/pytest-families.log 2>&1; echo "families rc $?"; tail -5 $OUT/pytest-families.log
timeout 100 python3 -m tigon.cli bench --op group_norm,sparsemax --model llama3-8b --providers eager,compile,tigon,liger --quiet --json $OUT/bench-newops.json; echo "bench rc $?"
timeout 100 python3 -m tigon.cli bench --op group_norm,sparsemax,cross_entropy --model llama3-8b --tokens 8192 --providers eager,compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-newops-graph.json; echo "bench graph rc $?"
timeout 60 python3 -m tigon.cli bench --op cross_entropy,fused_linear_cross_entropy --model llama3-8b --tokens 8192 --providers tigon,liger --quiet --json $OUT/bench-ce.json; echo "bench ce rc $?"
timeout 130 python3 -m tigon.cli profile qwen2.5-0.5b --batch-size 4 --seq-len 1024 --dtype bfloat16 --steps 10 --warmup 3 --json $OUT/profile-qwen.json > $OUT/profile-qwen.txt 2>&1; echo "profile rc $?"
tail -60 $OUT/profile-qwen.txt
