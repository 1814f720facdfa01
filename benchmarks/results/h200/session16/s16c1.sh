# Session 16, call 1: issue 26's full-depth Llama-3-8B rows under checkpointing (HF, Liger, Tigon; Tigon's selective
# policy at its default budget and at 20 GiB), and poly_norm's in-place tests on CUDA.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
timeout 60 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_poly_norm.py -k in_place > $OUT/pytest-polynorm.log 2>&1; echo "pytest rc $?"; tail -15 $OUT/pytest-polynorm.log | cut -c1-300
python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --gradient-checkpointing non_reentrant --kernel-summary --steps 4 --warmup 2 --timeout 105 --providers original,liger,tigon,tigon_sac --out-dir $OUT/gc 2>&1 | tail -25
python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --gradient-checkpointing non_reentrant --checkpoint-budget-gb 20 --kernel-summary --steps 4 --warmup 2 --timeout 105 --providers tigon_sac --out-dir $OUT/gc-budget20 2>&1 | tail -12
