# Session 31, call 4 (carry .wheels/trl and .peers/w): issue 29's end-to-end DPO row: TRL 1.16's DPOTrainer,
# Llama-3-8B shapes cut to 4 layers, 4 preference pairs of 1024 tokens a step, the reference model in the step,
# bf16; HF (TRL as shipped), Liger (use_liger_kernel=True), Tigon (tigon.patch + patch_trainer), one process each,
# then the merged table; about 400 s
#   bash benchmarks/results/h200/session31/s31c4.sh
source .peers/w/install.sh; eval "$(sh .wheels/trl/install.sh)"; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1; date
for p in hf liger tigon; do
  timeout 130 python3 benchmarks/dpo_e2e.py --provider $p --steps 12 --warmup 4 \
    --out $W/dpo-e2e-${p}_llama3-8b-4l_$G.json 2>&1 | grep -v -i warn | tail -3; date
done
python3 benchmarks/dpo_e2e.py --table $W 2>&1 | tail -6
(cd $W && tar czf $OUT/s31c4.tgz .) && rm -rf $W
