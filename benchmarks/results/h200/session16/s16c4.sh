# Session 16, call 4: Llama-3.2-1B all 16 layers without checkpointing, eager and compiled (issues 26, 28), and the
# LoRA rows at Qwen2.5-7B and Llama-3.2-1B shapes (issue 25).
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
python3 benchmarks/e2e_table.py --model qwen2.5-7b --lora 16 --batch-size 2 --seq-len 2048 --steps 6 --warmup 2 --timeout 120 --providers original,liger,tigon --out-dir $OUT/lora-qwen7b 2>&1 | grep -v Warn | tail -6
python3 benchmarks/e2e_table.py --model llama3.2-1b --lora 16 --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 --timeout 80 --providers original,liger,tigon --out-dir $OUT/lora-1b 2>&1 | grep -v Warn | tail -6
python3 benchmarks/e2e_table.py --model llama3.2-1b --batch-size 4 --seq-len 1024 --steps 12 --warmup 3 --timeout 150 --providers original,original_compile,liger,tigon,tigon_compile --out-dir $OUT/e2e-1b 2>&1 | grep -v Warn | tail -8
