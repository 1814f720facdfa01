"""The verdict of ``tigon compare`` on agreement: whether the patched run's per-step losses stay within the bound
expected for the run's training precision (:data:`LOSS_RTOL`, the measurements behind each bound in the comment above
it), :func:`judge_agreement`. Used by :mod:`tigon.workflows.compare` (``CompareResult.agreement``, exit code 3)."""

from __future__ import annotations

from typing import Any

# The verdict on agreement (CompareResult.agreement, :func:`judge_agreement`): the largest per-step relative loss
# difference of the two runs against a bound per training precision. A correct patch does not reproduce the original
# bit for bit: its kernels reduce in another order (and compute in fp32 where the original rounds op by op), the loss
# moves by ~1e-7 relative at the first step in fp32, and AdamW carries the difference into every later step, where a
# loss spike can amplify it by 100x. The bounds must hold for every correct patch of the project's compare scenarios,
# with a margin, and fail on a real error of an op. Measured (correct patch, max over the run):
#   float32: the CPU default (tiny, 20 steps of 2 x 32, interpreted kernels) 2.1e-7, 80 steps 3.2e-6; on an H200
#     (benchmarks/results/h200/compare_*_fp32.json) the CUDA default (small, 50 steps of 8 x 512) 4.7e-5, growing from
#     1e-7 to 1.6e-5 over a loss spike at steps 36-39, and llama3-8b with 2 layers (10 steps of 4 x 1024) 2.7e-5.
#     tests/test_families.py asserts 1e-4 per step for 20 steps of the mini models; a compare run is longer (50 steps
#     on CUDA) on larger models, and the H200 runs already reach half of 1e-4, so 1e-4 would fail a correct patch.
#     A wrong op on the CPU default: swiglu's output x 1.01 gives 4.6e-3 (above 1e-3 at steps 18 and 20 only, its
#     first 17 steps stay below 7e-4: a shorter run can miss it), RMSNorm's backward without its normalisation term
#     (the rms treated as a constant) 2.2e-2 (2.7e-3 at step 3). Bound 1e-3: 20x above the largest correct run, 4.6x
#     below a 1% error of one op over the default's 20 steps.
#   bfloat16 (pure: weights, gradients, AdamW state): every weight update is rounded to bf16 (relative spacing
#     7.8e-3), and after a loss spike a rounding-sensitive step moves by percents: tests/test_families.py's bf16 mini
#     models agree within 2e-2 except Gemma's at 2.6%, where a control with no Tigon code (HF's RoPE in fp32, rounded
#     once) moves the same step by 1.7%. Measured here: the CPU default 6.6e-4 (seed 0) and 9.0e-4 (seed 1),
#     llama3-8b with 2 layers on an H200 4.8e-3. Bound 5e-2, twice the largest correct difference: loose, it catches
#     gross errors only (the swiglu x 1.01 and the RMSNorm backward errors above stay below it: 1.7e-3 and 2.1e-2).
#   float16 (autocast over fp32 weights, GradScaler): the CPU default 5.1e-3 (seed 0) and, over the steps the verdict
#     judges, 2.2e-4 (seed 1); the half-precision forward rounds as bf16 does, 8x finer, but no GPU run was measured,
#     so it takes bf16's bound: 5e-2. When the GradScaler skips a step in one run only (an overflow is a threshold:
#     seed 1 of the CPU default skips step 9 in the original only, and from step 10 the losses are up to 17% apart)
#     the runs no longer take the same optimizer steps, and only the steps up to that one are judged.
# AdamW divides each gradient element by its own running RMS, so an error that scales a gradient by a constant hardly
# changes the training: RMSNorm's weight gradient x 1.01 moved the CPU default's losses by 2.4e-7 (as a correct patch),
# and that gradient plus 1% of its mirror image (g + 0.01 * g.flip(-1)) by 3e-5. A loss comparison cannot see such
# errors; `tigon verify` checks each op's values and gradients against float64.
LOSS_RTOL = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 5e-2}
LOSS_RTOL_REASON = {  # (shown next to the bound; the measurements are in the comment above)
    "float32": "fp32 kernels differ from the original by ~1e-7 per step, AdamW grows that to ~5e-5 in 50 steps; "
               "a 1% error in one op gives > 4e-3",
    "bfloat16": "pure bf16 rounds every update; correct runs measured up to 2.6% apart; gross errors only",
    "float16": "autocast rounds activations to fp16, bf16's bound; gross errors only",
}


def _first_skip_mismatch(grad_scaler: dict[str, dict[str, Any]] | None) -> int | None:
    """The first 1-based step the GradScaler skipped in one run only, or None."""
    if not grad_scaler:
        return None
    a, b = (set(grad_scaler[run]["skipped_steps"]) for run in ("original", "patched"))
    return min(a ^ b) if a ^ b else None


def judge_agreement(rel: list[float], dtype: str, status: dict[str, str],
                    grad_scaler: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The verdict on whether the patched run's losses agree with the original's.

    Args:
        rel: per-step relative loss differences (``CompareResult.rel_loss_diff``).
        dtype: the run's dtype name, a key of :data:`LOSS_RTOL` (the bound and the reason for it are there).
        status: {"original", "patched"} -> "ok" / "non-finite" / "diverged"; a run that is not ok is not judged.
        grad_scaler: float16's ``CompareResult.grad_scaler``; when one run skipped a step the other did not, only the
            steps up to that one are judged (after it the runs took different optimizer steps).

    Returns:
        {"verdict": "agree" | "differ" | "not judged", "dtype", "bound", "bound_reason", "steps_judged",
        "max_rel_loss_diff", "max_rel_loss_diff_step", "last_rel_loss_diff", "last_step", "summary", "detail"}:
        ``max_rel_loss_diff`` over the judged steps, ``last_*`` at the last judged step, ``summary`` the one-line
        result ("losses agree (max rel diff X <= bound Y for DTYPE)" or "losses differ beyond the expected bound (X >
        Y for DTYPE, step N)"), ``detail`` why fewer steps were judged ("" otherwise).
    """
    bound = LOSS_RTOL[dtype]
    out: dict[str, Any] = {"verdict": "not judged", "dtype": dtype, "bound": bound,
                           "bound_reason": LOSS_RTOL_REASON[dtype], "steps_judged": 0, "max_rel_loss_diff": None,
                           "max_rel_loss_diff_step": None, "last_rel_loss_diff": None, "last_step": None,
                           "summary": "", "detail": ""}
    bad = [f"the {run} run is {s}" for run, s in status.items() if s != "ok"]
    if bad or not rel:
        out["summary"] = "losses not judged: " + ("; ".join(bad) or "no steps")
        return out
    judged = len(rel)
    skip = _first_skip_mismatch(grad_scaler)
    if skip is not None and skip < len(rel):
        judged = skip  # (step ``skip``'s loss comes before its update: still comparable)
        which = "original" if skip in grad_scaler["original"]["skipped_steps"] else "patched"
        out["detail"] = (f"steps 1-{skip} judged: the GradScaler skipped step {skip} in the {which} run only (a "
                         "gradient overflow), so the runs took different optimizer steps after it")
    part = rel[:judged]
    step = max(range(judged), key=part.__getitem__) + 1  # (no NaN: both runs are finite)
    worst = part[step - 1]
    agree = worst <= bound
    out.update(verdict="agree" if agree else "differ", steps_judged=judged, max_rel_loss_diff=worst,
               max_rel_loss_diff_step=step, last_rel_loss_diff=part[-1], last_step=judged)
    if agree:
        out["summary"] = f"losses agree (max rel diff {worst:.2e} <= bound {bound:.0e} for {dtype})"
    else:
        out["summary"] = (f"losses differ beyond the expected bound (max rel diff {worst:.2e} > bound {bound:.0e} for "
                          f"{dtype}, step {step})")
    return out
