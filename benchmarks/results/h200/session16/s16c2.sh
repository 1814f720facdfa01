# Session 16, call 2: the automatic selective budget with the foreach AdamW step's room (Llama-3-8B), and the
# Qwen2.5-7B 28-layer rows under checkpointing (HF, Liger, Tigon, Tigon selective).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
python3 benchmarks/e2e_table.py --model llama3-8b --batch-size 4 --seq-len 2048 --gradient-checkpointing non_reentrant --kernel-summary --steps 4 --warmup 2 --timeout 105 --providers tigon_sac --out-dir $OUT/gc-auto 2>&1 | grep -v Warn | tail -8
python3 benchmarks/e2e_table.py --model qwen2.5-7b --batch-size 4 --seq-len 2048 --gradient-checkpointing non_reentrant --kernel-summary --steps 4 --warmup 2 --timeout 105 --providers original,liger,tigon_sac --out-dir $OUT/qwen-gc 2>&1 | grep -v Warn | tail -14
