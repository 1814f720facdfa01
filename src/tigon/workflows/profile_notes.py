"""The notes of ``tigon profile``'s report: what each measurement means, where the host waited, which
replacements slow the step (:func:`add_notes`; :mod:`tigon.workflows.profile` builds the report)."""

from __future__ import annotations

from typing import Any

import torch

from .timing import LAUNCH_QUEUE_DEPTH

PROFILED_STEPS = 3
"""At most this many steps run under the profiler (the timed steps are ``steps``, as ``tigon bench --e2e``)."""


def add_notes(r: Any, device: torch.device) -> None:
    """Add the notes of a :class:`tigon.workflows.profile.ProfileResult` ``r`` measured on ``device``."""
    cfg = r.config
    r.notes.insert(0, f"categories: {r.time_basis}, mean of {min(cfg['steps'], PROFILED_STEPS)} profiled step(s); "
                      "with 'kernels linked to no op' and the device's idle time they add up to the profiled step.")
    r.notes.insert(1, f"step times: median of {cfg['steps']} unprofiled step(s) after {cfg['warmup']} warm-up "
                      "step(s), measured as tigon bench --e2e measures them (the same code, model, batches and "
                      "optimizer), before any profiler ran.")
    if r.attribution_scale < 0.999:
        r.notes.append(f"the categories held {100 / r.attribution_scale - 100:.1f}% more kernel time than the device "
                       "was busy (time counted twice) and were scaled down to its busy time.")
    lim = r.limits["original"]
    if device.type == "cuda":
        r.notes.append(f"limits: host = the host's time to issue one full step, in {lim.get('host_parts', 0)} parts "
                       "(embedding, each decoder layer's forward and backward, optimizer), each issued with the "
                       "device held busy by a sleep kernel so the host never waits for it, timed until the part "
                       "ends (time.perf_counter); device = the device's time to run those parts (CUDA events). The "
                       f"original step is {lim['bound']}-bound (host {lim['host_ms']:.1f} ms, device "
                       f"{lim['device_ms']:.1f} ms, step {lim['step_ms']:.1f} ms).")
        for key in ("original", "patched"):
            _issue_notes(r, key)
    else:
        r.notes.append("limits: on a CPU nothing runs asynchronously, so the host time is the step time (H = T, "
                       "D = 0).")
    r.notes.append("prediction: T' = T - pipeline(H_u, D) + pipeline(H_u', D'), pipeline = max(D, H_u - optimizer's "
                   "host + optimizer's device, H_u) (the forward and backward overlap host and device, the optimizer "
                   "ends the step), in the host's unheld basis: H_u = the parts' host time with the device running "
                   "along (host_unheld_ms; the held H overstates a host-bound step's host time), the optimizer's "
                   "host scaled alike; D' adds the whole parts' device change where measured (else the replaced "
                   "calls'), H_u' the replaced calls' unheld host change (in the step where measured; a held time "
                   "converted by its own call's unheld / held ratio, else by H_u / H): a host-bound step pays the "
                   "replacements' host cost.")
    pred = r.limits.get("predicted", {})
    if pred.get("host_basis") == "layers":
        groups = " + ".join(f"{g['count']} x (patched - original layer {g['index']})"
                            for g in r.layers.get("groups", []))
        r.notes.append(f"host prediction from whole parts: H' = H + {groups} + "
                       f"(patched - original rest of the model), one forward + backward of each timed like H "
                       f"(behind a sleep kernel): {r.layers['host_delta_ms'].get('patched', 0.0):+.1f} ms per step; "
                       f"adding the per-op host changes instead predicts {pred['step_ms_per_op']:.1f} ms "
                       f"(H' {pred['host_ms_per_op']:.1f} ms)"
                       + (f"; the parts' host time with the device not held (no sleep, the launch queue short) "
                          f"predicts {pred['alternative']['step_ms']:.1f} ms" if pred.get("alternative") else "")
                       + ". A kind's host change is what leaving it out of the patched parts gives back "
                       "(tigon.patch(model, kind=False), measured).")
    elif pred.get("layers"):
        r.notes.append(f"host prediction from the replaced calls' host changes (in the step where measured); the "
                       f"whole parts (one decoder layer and the rest of the model, original and patched, each timed "
                       f"alone) predict {pred['layers']['step_ms']:.1f} ms (H' {pred['layers']['host_ms']:.1f} ms). "
                       "Parts timed alone have missed the step's host time by 40-60% on a host-bound model, so they "
                       "are shown, not used.")
    in_step = [o["kind"] for o in r.ops if o.get("host_basis") == "in_step"]
    if in_step:
        over = r.host_in_step.get("original", {}).get("overhead", {})
        r.notes.append(f"host change of {', '.join(in_step)}: measured inside the step, not from isolated calls: the "
                       "host's self time in the modules each kind replaces (forward hooks; identity autograd nodes on "
                       "their inputs and outputs for the backward), in the original and the patched step issued "
                       "behind the sleep as for H, the hooks' own cost subtracted (per module call: "
                       f"{1e3 * over.get('own_forward_ms', 0):.1f} us forward, "
                       f"{1e3 * over.get('own_backward_ms', 0):.1f} us backward, measured on an empty module). "
                       "Against the isolated calls it shows the integration layer's own Python and the backward "
                       "inside one autograd pass.")
    for op in r.ops:
        waited = [side for side in ("original", "tigon") if op[side].get("waited")]
        if waited:
            r.notes.append(f"{op['kind']} ({op['op']}): the host waited for the device during the "
                           f"{' and '.join(waited)} call(s) however long the sleep (a sync inside, or too many "
                           "launches); their host time is the wall time without the sleep.")
        if op["slows_step"]:
            r.notes.append(f"{op['kind']} ({op['op']}): replacing it is predicted to slow the step (host "
                           f"{op['host_delta_ms']:+.1f} ms, device {op['device_delta_ms']:+.1f} ms per step); "
                           f"{op['patch_call']} leaves it out: predicted {op['step_ms_without']:.1f} ms"
                           + _memory_cost(op) + ".")
    if r.advice and r.advice["best_keywords"]:
        timed = {o["kind"] for o in r.ops}
        untimed = [k for k in (r.patch or {}) if k not in timed and k != "lora"]  # (sinks: no op of the registry)
        nothing = (f"; that replaces none of the timed ops (it keeps {', '.join(untimed)}, not timed: "
                   f"{', '.join(f'{k}=False' for k in untimed)} leaves {'them' if len(untimed) > 1 else 'it'} out too)."
                   if untimed else "; that replaces nothing: leave the model unpatched.")
        r.notes.append(f"fastest predicted: {r.advice['best_call']} at {r.advice['best_step_ms']:.1f} ms "
                       f"(everything: {r.predicted_step_ms_patched:.1f} ms)"
                       + (nothing if r.advice["replace_nothing"] else "."))
    if device.type == "cpu":
        r.notes.append("CPU: Tigon's kernels run in Triton's interpreter, so the patched step, the op costs and the "
                       "prediction measure the interpreter; run on a CUDA GPU for real numbers.")


def _memory_cost(op: dict) -> str:
    """``", at X MiB more per call at its peak"``: what leaving a kind out costs in memory (its isolated calls' peak
    extra bytes, original minus Tigon), or ``""`` when not measured or not more."""
    o, t = op["original"].get("peak_extra_bytes"), op["tigon"].get("peak_extra_bytes")
    if o is None or t is None or o <= t:
        return ""
    return f", at {(o - t) / 2**20:.0f} MiB more per call at its peak ({o / 2**20:.0f} against {t / 2**20:.0f})"


def _issue_notes(r: Any, key: str) -> None:
    """Notes on the host measurement of ``r.limits[key]``: waits for the device, syncs, launches, H > T."""
    lim = r.limits.get(key)
    if not lim or "host_parts" not in lim:
        return
    if lim["host_waited"]:
        r.notes.append(f"{key} step: in {len(lim['host_waited'])} part(s) ({', '.join(lim['host_waited'][:4])}"
                       f"{', ...' if len(lim['host_waited']) > 4 else ''}) the host waited for the device however "
                       "long the sleep: a sync inside the step (" + ("; ".join(lim["syncs"][:3]) or "none named by "
                       "torch.cuda.set_sync_debug_mode") + ") or more launches than the queue holds; those parts "
                       "count with their wall time without the sleep, so H includes the wait.")
    elif lim["syncs"]:
        r.notes.append(f"{key} step synchronises ({'; '.join(lim['syncs'][:3])}) outside the timed parts.")
    ops = lim.get("device_ops") or 0
    if ops > LAUNCH_QUEUE_DEPTH:
        r.notes.append(f"{key} step: {ops:.0f} kernels, copies and sets per step, more than the ~{LAUNCH_QUEUE_DEPTH} "
                       f"the launch queue holds: one sleep could not hide the device for the whole step, hence the "
                       f"{lim['host_parts']} parts (about {ops / lim['host_parts']:.0f} launches each)"
                       + ("; that is near the queue's depth: parts above it wait (see host_waited)."
                          if ops / lim["host_parts"] > LAUNCH_QUEUE_DEPTH / 2 else "."))
    if lim["host_ms"] > 1.02 * lim["step_ms"]:
        unheld = lim.get("host_unheld_ms")
        tail = (f"; the unheld host time ({unheld:.1f} ms, the device running along) is the prediction's basis"
                if unheld is not None and unheld <= 1.02 * lim["step_ms"] else "")
        r.notes.append(f"{key} step: the host time held behind the sleep ({lim['host_ms']:.1f} ms) exceeds the step "
                       f"({lim['step_ms']:.1f} ms) it should bound: the held host measurement is suspect{tail}.")
