# Session 22, MoE / VLM calls (issue 20 item 5): the end-to-end speed row of one model per call, 4 decoder layers, bf16,
# AdamW, one process per provider (HF eager, HF + compile, Liger, Tigon, Tigon + compile). Carry .peers/w; one call
# per row (each fits 560 s; all three do not):
#   bash benchmarks/results/h200/session22/s22c_moe.sh gpt-oss-20b     # GPT-OSS-20B shape, 32 experts top-4, 4 x 2048
#   bash benchmarks/results/h200/session22/s22c_moe.sh olmoe-1b-7b     # OLMoE-1B-7B shape, 64 experts top-8, 4 x 2048
#   bash benchmarks/results/h200/session22/s22c_moe.sh qwen2.5-vl-7b   # Qwen2.5-VL-7B, 4 x 2048 with 512 image tokens
# PROVIDERS=a,b,... in the environment replaces the provider list (fewer providers, a shorter call); E2E_ARGS adds
# e2e_table.py options (e.g. --kernel-summary: each provider's last step profiled, kernels by kind).
# The MoE configs are benchmarks/configs/<row>/config.json (sources in benchmarks/configs/README.md; the router
# load-balancing loss on). HF eager's peak, estimated on the CPU with fake tensors (PyTorch's MemTracker, the same
# AdamW): GPT-OSS ~64 GiB (4.45 B parameters: 33 GiB of bf16 weights + gradients + AdamW states, eager attention's
# 64 x 2048^2 scores and the 201088-wide fp32 logits on top), OLMoE ~22 GiB, Qwen2.5-VL ~57 GiB (text ~35 GiB + the
# 32-block ViT over 4 x 2048 patches): all under 75 GiB. Per-provider limits leave the compiled ones their compilation.
source .peers/w/install.sh; export PYTHONPATH=$PWD/src:$PYTHONPATH PYTHONUNBUFFERED=1
W=$OUT/w; mkdir -p $W; G=$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo h200 || echo h100)
nvidia-smi --query-gpu=name --format=csv,noheader
git log --oneline -1
ROW=${1:?usage: s22c_moe.sh gpt-oss-20b|olmoe-1b-7b|qwen2.5-vl-7b}
P=${PROVIDERS:-original,tigon,liger,original_compile,tigon_compile}   # eager first: a slow compilation cannot cost them
case $ROW in
  gpt-oss-20b) M=benchmarks/configs/gpt-oss-20b; X=""; T=65,liger=55,original_compile=120,tigon_compile=120 ;;
  olmoe-1b-7b) M=benchmarks/configs/olmoe-1b-7b; X=""; T=55,liger=45,original_compile=120,tigon_compile=120 ;;
  qwen2.5-vl-7b) M=qwen2.5-vl-7b; X="--image-tokens 512"; T=75,liger=60,original_compile=150,tigon_compile=150 ;;
  *) echo "unknown row $ROW"; exit 2 ;;
esac
timeout ${ROW_TIMEOUT:-550} python3 benchmarks/e2e_table.py --model $M --layers 4 --batch-size 4 --seq-len 2048 $X ${E2E_ARGS:-} \
  --steps 8 --warmup 3 --timeout $T --gpu $G --providers $P --out-dir $W/e2e-$ROW-4l 2>&1 | grep -v Warn | tail -12
python3 - $W/e2e-$ROW-4l <<'EOF' 2>&1 | tail -8
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/e2e-*.json")):
    r = json.load(open(f))
    for x in r["rows"]:
        print(x["provider"], x["status"], "losses", [round(v, 4) for v in x.get("losses", [])[:2]],
              "patch", x.get("patch"), (x.get("note") or "")[:120])
EOF
(cd $W && tar czf $OUT/s22c_moe-$ROW.tgz .) && rm -rf $W
