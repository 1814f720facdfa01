# Session 16, call 3: issue 25's full-depth LoRA row (Llama-3-8B, 32 layers, rank 16, PEFT), HF + PEFT, Liger, Tigon.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
python3 benchmarks/e2e_table.py --model llama3-8b --lora 16 --batch-size 2 --seq-len 2048 --kernel-summary --steps 6 --warmup 2 --timeout 150 --providers original,liger,tigon --out-dir $OUT/lora32 2>&1 | grep -v Warn | tail -14
