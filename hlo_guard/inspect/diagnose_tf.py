"""``diagnose`` for TensorFlow: the same report, from TF's XLA gradient.

TF's eager gradient of ``where(x > 0, sqrt(x), 0)`` is right (its ``Select``
gradient selects) while the same program under ``jit_compile=True`` is NaN,
so the *plain* derivative diagnosed here is the XLA one.  Lanes are
classified exactly as for JAX, by computing: ``hlo_guard.tf.guard(fn)``'s
XLA gradient finite there is a leak, still non-finite is genuine, a
non-finite argument lane is input.

What differs: TF has no per-equation re-evaluation here, so a leak's causes
are the guard sites hlo_guard places for its dead lanes (the singular op and
the selections that make its lanes dead, both with file:line, from the same
records ``explain`` shows), and genuine lanes name no operation.  Reverse
mode only.
"""

from __future__ import annotations

import numpy as np

from hlo_guard.errors import GuardUsageError


def looks_like_tf(fn, args) -> bool:
    """TF tensors or variables among the arguments, or a TF-guarded ``fn``."""
    from hlo_guard.inspect.explain_tf import is_tf_guarded

    if is_tf_guarded(fn):
        return True
    return any(type(a).__module__.startswith("tensorflow") for a in args)


def diagnose_tf(fn, *args, argnums=0, mode: str = "reverse"):
    import tensorflow as tf

    import hlo_guard.tf as hg
    from hlo_guard.inspect.diagnose_report import DiagnoseReport, LaneGroup, check_argnums

    if mode != "reverse":
        raise GuardUsageError("diagnose of a TensorFlow function supports mode='reverse' only")
    nums = check_argnums(argnums, len(args))
    tensors = [tf.convert_to_tensor(a) for a in args]
    for i in nums:
        if not tensors[i].dtype.is_floating:
            raise GuardUsageError(
                f"argument {i} has dtype {tensors[i].dtype.name}: "
                "only floating-point arguments have a derivative"
            )
    plain_fn = getattr(fn, "python_function", fn)
    guarded = fn if _is_guarded(fn) else hg.guard(plain_fn)

    def xla_gradient(f):
        @tf.function(jit_compile=True)
        def run(*xs):
            with tf.GradientTape() as tape:
                for i in nums:
                    tape.watch(xs[i])
                outs = tf.nest.flatten(f(*xs))
                total = tf.add_n([tf.reduce_sum(o) for o in outs if o.dtype.is_floating])
            return tape.gradient(total, [xs[i] for i in nums])

        return [np.asarray(g) for g in run(*tensors)]

    plain = xla_gradient(plain_fn)
    fixed = xla_gradient(guarded)
    names = _names(plain_fn, nums)
    report = DiagnoseReport(
        framework="tensorflow",
        function=getattr(plain_fn, "__name__", "function"),
        mode=mode,
        lanes=int(sum(p.size for p in plain)),
        nonfinite_inputs=[
            names[k][len("d/d") :]
            for k, i in enumerate(nums)
            if not np.all(np.isfinite(tensors[i].numpy()))
        ],
    )
    if all(np.all(np.isfinite(p)) for p in plain):
        return report
    sites = hg.report(guarded, *tensors).guards
    leak_causes = [
        {
            "kind": "leak",
            "primitive": s.op,
            "location": s.location,
            "lanes": 0,
            "examples": [],
            "selections": [(o.op, o.location) for o in s.origins],
            "unknown": False,
        }
        for s in sites
        if getattr(s, "mode", "reverse") == "reverse"
    ]
    for k, (p, g) in enumerate(zip(plain, fixed)):
        bad = ~np.isfinite(p)
        if not bad.any():
            continue
        own = tensors[nums[k]].numpy()
        is_input = bad & ~np.isfinite(own) if own.shape == p.shape else bad & False
        leak = bad & ~is_input & np.isfinite(g)
        genuine = bad & ~is_input & ~np.isfinite(g)
        for kind, lanes in (("input", is_input), ("leak", leak), ("genuine", genuine)):
            if not lanes.any():
                continue
            note = ""
            causes = leak_causes if kind == "leak" else []
            if kind == "leak":
                note = "causes: the guard sites hlo_guard places for these dead lanes"
            elif kind == "genuine":
                note = "still non-finite under the guard (TF: no per-operation attribution)"
            idx = np.argwhere(lanes)[:8].tolist()
            report.groups.append(
                LaneGroup(kind, names[k], int(lanes.sum()), idx, list(causes), note)
            )
    return report


def _is_guarded(fn) -> bool:
    from hlo_guard.inspect.explain_tf import is_tf_guarded

    return is_tf_guarded(fn)


def _names(fn, nums) -> list[str]:
    from hlo_guard.inspect.diagnose_report import argument_name

    return ["d/d" + argument_name(fn, i) for i in nums]
