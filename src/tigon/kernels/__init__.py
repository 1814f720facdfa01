"""Tigon's Triton kernels: one module per kernel family, each reading top to bottom as kernels, launchers, the
eager ``torch.autograd.Function``, then the same launchers as ``torch.library`` custom ops for ``torch.compile``.

Import these modules only once ``TRITON_INTERPRET`` is decided (the op modules of :mod:`tigon.ops` import them on
the first kernel call): Triton reads it when a kernel is defined.

**The custom ops.** ``torch.compile`` sees each kernel as a single graph node.

Why: left to itself, dynamo traces into an op's Python launcher (block-size heuristics, dict caches, storage
pointer checks, ``torch.mm(..., out=)`` into preallocated buffers), where it hits code it cannot capture and splits
the model's graph (a graph break: the compiled region ends, Python runs the op, a new region starts, and the
optimiser never sees across it); under ``TRITON_INTERPRET=1`` it traced into the Triton interpreter itself and
compilation failed outright (a KeyError on uint64 fake tensors in the interpreter's pointer arithmetic). A
custom op is opaque instead: dynamo and AOTAutograd only run its *fake* implementation (shapes, dtypes and
strides, no data) while tracing, inductor calls the real implementation as an extern kernel, and the backward is
another custom op wired in with ``register_autograd``. One kernel path stays one kernel path: every op here calls
the same launcher functions as the eager ``torch.autograd.Function`` in its op module (``rms_norm_forward``,
``rope_apply``, ``glu_forward``, ``flce_forward`` ...); nothing about blocks, dtypes or chunking is repeated.

Calling convention. The op modules of :mod:`tigon.ops` call each kernel module's ``compiled_<name>`` entry (the
last function of the module) only while ``torch.compiler.is_compiling()``; each takes exactly the arguments of
the module's ``XFunction.apply``, so the switch is one line per op. Eager calls keep the direct
autograd.Function: the custom-op dispatcher costs about 35 us per forward call and 75 us per forward + backward on
a 2-core CPU host (measured against 9 / 78 us for the autograd.Function with the same empty body), 130+ calls per
Llama training step, which would be pure overhead outside a compiled graph.

Schema conventions (custom ops return tensors, never None, and outputs never alias inputs):

* an output that is not computed (a gradient not needed, a z-loss not requested) is an empty ``(0,)`` tensor;
* loss options travel as scalars (``ignore_index, label_smoothing, lse_square_scale, softcap, logit_scale``),
  ``num_items_in_batch`` as an optional 0-d tensor;
* ``inplace_backward`` of the GLU and cross-entropy ops is ignored under compile (a custom op may not return its
  input's memory as a gradient; inductor plans the backward's buffers itself); the results are the same.
* A second backward through a compiled graph is not detected as it is in eager mode (mean/sum fused linear
  cross-entropy forms its gradients in the forward; retain_graph then scales the same saved gradients again,
  which is correct, not an error). The post-training losses' ``tigon::formed_head_grads``
  (:mod:`tigon.kernels.formed_grads`) does raise there, as their eager path does.
"""
