"""Which attention ops run in a checkpointed tiny sdpa Llama's forward and backward on this device (issue 26 test)."""
import sys, collections, torch
sys.path.insert(0, "tests")
from torch.utils._python_dispatch import TorchDispatchMode
import test_checkpointing as tc
import tigon
from tigon import checkpointing

class Log(TorchDispatchMode):
    def __init__(self):
        super().__init__(); self.c = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        n = str(func)
        if any(s in n for s in ("attention", "bmm", "softmax", "baddbmm")):
            self.c[n] += 1
        return func(*args, **(kwargs or {}))

for patched, gqa in ((False, True), (True, True), (False, False), (True, False)):
    m = tc.sdpa_llama()
    if not gqa:
        cfg = m.config; cfg.num_key_value_heads = cfg.num_attention_heads
        m = type(m)(cfg).to(tc.DEVICE, tc.DTYPE).train()
    if patched:
        tigon.patch(m)
    tc.checkpointed(m, False)
    ids = torch.randint(0, m.config.vocab_size, (tc.B, tc.T), device=tc.DEVICE)
    with Log() as f:
        out = m(input_ids=ids, labels=ids)
    with Log() as b:
        out.loss.backward()
    print("patched" if patched else "original", "gqa" if gqa else "mha", tc.DEVICE, tc.DTYPE, "attn_impl",
          m.config._attn_implementation)
    print("  forward ", dict(f.c)); print("  backward", dict(b.c))
print("attention_ops", sorted(str(o) for o in checkpointing.attention_ops()))
