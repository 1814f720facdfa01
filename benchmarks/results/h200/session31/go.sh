# Session 31: one call, the script for the card it lands on: H200 -> s31h<N>.sh, else (H100) s31c<N>.sh
#   bash benchmarks/results/h200/session31/go.sh N
D=benchmarks/results/h200/session31
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash $D/s31h$1.sh; else bash $D/s31c$1.sh; fi
