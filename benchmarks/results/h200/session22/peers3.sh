# Bring the peers to the GPU machine in three calls (the CuTe DSL runtime in thirds, .peers/q0..q2, each carried
# beside .peers/w; the machine keeps /tmp while it stays warm), for a working tree too large for the two halves of
# shared/gpu-peers: source this at the start of each call's command instead of .peers/w/install.sh.
mkdir -p /tmp/peers-stage
for _q in .peers/q0 .peers/q1 .peers/q2; do [ -d "$_q" ] && cp "$_q"/piece* /tmp/peers-stage/; done
if [ ! -f /tmp/peers-stage/part00 ] && [ -f /tmp/peers-stage/piece0 ] && [ -f /tmp/peers-stage/piece1 ] \
   && [ -f /tmp/peers-stage/piece2 ]; then
  cat /tmp/peers-stage/piece0 /tmp/peers-stage/piece1 /tmp/peers-stage/piece2 > /tmp/peers-stage/part00
  : > /tmp/peers-stage/part01
fi
source .peers/w/install.sh
