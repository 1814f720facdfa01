# Session 13, call 4: branches host-light (.gpu/hl) and norm-speed (.gpu/ns) before their merge.
source .peers/w/install.sh; export PYTHONUNBUFFERED=1; P0=$PYTHONPATH
cd .gpu/ns && export PYTHONPATH=$PWD/src:$P0
timeout 50 python3 -m pytest -q -p no:cacheprovider -rfs -x tests/test_group_norm.py tests/test_dyt.py > $OUT/pytest-ns.log 2>&1; echo "pytest ns rc $?"; tail -2 $OUT/pytest-ns.log
timeout 50 python3 -m tigon.cli bench --op group_norm,dyt --model llama3-8b --providers eager,compile,tigon,liger --quiet --json $OUT/bench-ns.json; echo "bench ns rc $?"
timeout 40 python3 -m tigon.cli bench --op group_norm,dyt --model llama3-8b --tokens 8192 --providers eager,compile,tigon,liger --cuda-graph --quiet --json $OUT/bench-ns-graph.json; echo "bench ns graph rc $?"
cd ../hl && export PYTHONPATH=$PWD/src:$P0
timeout 60 python3 benchmarks/host_issue.py --ops rms_norm,swiglu --providers eager,tigon --modules --launch-probe --out $OUT/host-modules.json > /tmp/hm.txt 2>&1; echo "host rc $?"; tail -12 /tmp/hm.txt | cut -c1-220
TIGON_DIRECT_LAUNCH=1 timeout 50 python3 benchmarks/host_issue.py --ops rms_norm,swiglu --providers tigon --modules --out $OUT/host-modules-direct.json > /tmp/hd.txt 2>&1; echo "host direct rc $?"; tail -8 /tmp/hd.txt | cut -c1-220
