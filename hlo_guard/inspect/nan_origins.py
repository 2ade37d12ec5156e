"""Where a derivative turns non-finite: one equation at a time, on the
program's own values.

``diagnose`` needs to name the operation that *made* a NaN, not the one that
carried it.  This module re-runs the derivative of a jaxpr equation by
equation -- primal values first, then each equation's own VJP (reverse mode)
or JVP (forward mode) at its actual inputs -- and records every equation
whose derivative output is non-finite while everything it received was
finite.  That equation is where the NaN/inf is *created*.  In each created
lane the incoming cotangent (tangent) tells the two stories apart:

* it was an exact zero: a dead lane, ``0 * inf``: a **leak** -- the zero came
  from a selection (``where``, ``maximum``, indexing) downstream, whose
  location is carried along with the cotangent (``selections``);
* it was non-zero: a taken path through a point where the local derivative is
  infinite: a **genuine** singularity.

Plain calls (``jit``, ``closed_call``), the taken branch of ``cond`` and (in
reverse mode) every iteration of ``scan`` are followed into their bodies so
that the innermost user line is named; ``while`` loops and custom-derivative
calls are differentiated as one equation (their own rules decide), and a
creation inside them is attributed to the call.  Nothing here guesses: every record is
a value JAX computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from hlo_guard.jax_frontend.binding import bind_eqn
from hlo_guard.jax_frontend.bodies import body_of, open_jaxpr
from hlo_guard.jax_frontend.compat import scan_layout
from hlo_guard.jax_frontend.graph import Literal, is_inexact_aval
from hlo_guard.jax_frontend.rule_table import RULES
from hlo_guard.source import eqn_location

#: calls whose body is followed (custom-derivative calls are not: their rule
#: decides their derivative, so they are differentiated as one equation)
_FOLLOWED_CALLS = {"jit", "closed_call", "eval_jaxpr", "remat2"}

#: selecting primitives and the name users know them by
_SELECTIONS = {
    "select_n": "where",
    "max": "maximum",
    "min": "minimum",
    "clamp": "clip",
    "gather": "indexing",
    "dynamic_slice": "indexing",
    "slice": "slicing",
    "reduce_max": "max",
    "reduce_min": "min",
    "dynamic_update_slice": "indexing",
    "scatter": "indexing",
    "sort": "sort",
}

#: examples of offending inputs kept per created record
_EXAMPLES = 3


@dataclass
class Creation:
    """An equation whose derivative output is non-finite although its
    incoming derivative was finite."""

    kind: str  # "leak" (incoming exact zero) or "genuine" (incoming non-zero)
    primitive: str
    location: str
    lanes: int
    #: the primitive applied to offending input values, ``sqrt(0.0)``
    examples: list[str] = field(default_factory=list)
    #: (name, location) of the selections whose zeros reached it (leaks)
    selections: list[tuple[str, str]] = field(default_factory=list)
    #: True when hlo_guard has no rule for the primitive
    unknown: bool = False


def creations(closed_jaxpr, args, mode: str) -> list[Creation]:
    """Every creation of a non-finite derivative in ``closed_jaxpr`` at
    ``args``: reverse mode with a cotangent of ones on every output, forward
    mode with a tangent of ones on every input."""
    found: list[Creation] = []
    jaxpr, consts = closed_jaxpr.jaxpr, list(closed_jaxpr.consts)
    primal = _Primal()
    primal.run(jaxpr, consts, args, ())
    if mode == "forward":
        tangents = [_ones(a) for a in args]
        _, reach = _forward(jaxpr, (), args, tangents, primal, found)
    else:
        outs = [primal.read((), v) for v in jaxpr.outvars]
        cts = [_ones(o) for o in outs]
        _, _, reach = _reverse(jaxpr, (), cts, [frozenset()] * len(cts), primal, found, "")
    # only what reaches the derivative: a NaN a later select discards is no cause
    reaching = frozenset().union(*reach)
    return _merged([c for c in found if id(c) in reaching])


class _Primal:
    """Primal values of every variable, nested bodies included, keyed by the
    path of equation positions that leads to each body: one body jaxpr can
    serve several calls (``jnp.sqrt`` twice at one shape), and a ``scan``
    body runs once per iteration.  ``cond`` runs its taken branch."""

    def __init__(self):
        self.envs: dict[tuple, dict] = {}
        self.taken: dict[tuple, int] = {}  # a cond's path -> the branch it ran
        self.order: dict[tuple, list[int]] = {}  # a scan's path -> iterations run

    def run(self, jaxpr, consts, args, key: tuple = ()) -> list[Any]:
        env: dict = {}
        self.envs[key] = env
        for v, x in zip(jaxpr.constvars, consts):
            env[v] = x
        for v, x in zip(jaxpr.invars, args):
            env[v] = x
        for n, eqn in enumerate(jaxpr.eqns):
            invals = [self.read(key, v) for v in eqn.invars]
            name = eqn.primitive.name
            if name in _FOLLOWED_CALLS:
                body, body_consts = body_of(eqn)
                outs = self.run(body, body_consts, invals, key + (n,))
            else:
                outs = bind_eqn(eqn, invals)
                if name == "cond":
                    self._cond(eqn, invals, key + (n,))
                elif name == "scan":
                    self._scan(eqn, invals, key + (n,))
            for v, x in zip(eqn.outvars, outs):
                env[v] = x
        return [self.read(key, v) for v in jaxpr.outvars]

    def _cond(self, eqn, invals, key):
        branches = eqn.params["branches"]
        index = int(np.clip(np.asarray(invals[0]), 0, len(branches) - 1))
        self.taken[key] = index
        body, body_consts = open_jaxpr(branches[index])
        self.run(body, body_consts, invals[1:], key)

    def _scan(self, eqn, invals, key):
        body, body_consts = open_jaxpr(eqn.params["jaxpr"])
        n_consts, n_carry = scan_layout(eqn.params, len(eqn.invars))
        consts = list(invals[:n_consts])
        carry = list(invals[n_consts : n_consts + n_carry])
        xs = invals[n_consts + n_carry :]
        length = eqn.params["length"]
        order = list(range(length - 1, -1, -1) if eqn.params.get("reverse") else range(length))
        self.order[key] = order
        for i in order:
            outs = self.run(body, body_consts, consts + carry + [x[i] for x in xs], key + (i,))
            carry = list(outs[:n_carry])

    def read(self, key: tuple, atom):
        if isinstance(atom, Literal):
            return atom.val
        return self.envs[key][atom]


def _reverse(jaxpr, key, out_cts, out_sel, primal: _Primal, found, where: str, out_bad=None):
    """Cotangents of ``jaxpr``'s inputs, the selections their zeros came
    from, and the creation that made them non-finite, recording creations on
    the way.  ``where`` is the enclosing call's location, for equations whose
    own traceback is all inside JAX (``jnp.where``'s ``select_n``)."""
    ct: dict = {}
    sel: dict = {}
    bad: dict = {}  # var -> ids of the Creations its non-finite cotangent came from

    def add(v, c, s, b=frozenset()):
        if isinstance(v, Literal) or c is None or not is_inexact_aval(v.aval):
            return
        ct[v] = c if v not in ct else ct[v] + c
        sel[v] = sel.get(v, frozenset()) | s
        if b and not _finite(c):
            bad[v] = bad.get(v, frozenset()) | b

    for k, (v, c, s) in enumerate(zip(jaxpr.outvars, out_cts, out_sel)):
        add(v, c, s, out_bad[k] if out_bad else frozenset())
    for n in reversed(range(len(jaxpr.eqns))):
        eqn = jaxpr.eqns[n]
        outs = [v for v in eqn.outvars if not _is_drop(v)]
        if not any(v in ct for v in outs):
            continue
        diff = [
            i for i, v in enumerate(eqn.invars) if not isinstance(v, Literal) and _inexact(v.aval)
        ]
        if not diff:
            continue
        invals = [primal.read(key, v) for v in eqn.invars]
        cts_out = [
            ct.get(v, _zeros_like_aval(v.aval)) if not _is_drop(v) else _zeros_like_aval(v.aval)
            for v in eqn.outvars
        ]
        incoming = frozenset().union(*(sel.get(v, frozenset()) for v in outs))
        came_bad = frozenset().union(*(bad.get(v, frozenset()) for v in outs))
        name = eqn.primitive.name
        loc = eqn_location(eqn) or where
        out_sels = [sel.get(v, frozenset()) for v in eqn.outvars]
        out_bads = [bad.get(v, frozenset()) for v in eqn.outvars]
        if name == "cond" and key + (n,) in primal.taken:
            branch, _ = open_jaxpr(eqn.params["branches"][primal.taken[key + (n,)]])
            b_cts, b_sel, b_bad = _reverse(
                branch, key + (n,), cts_out, out_sels, primal, found, loc, out_bads
            )
            for i in diff:
                if i >= 1:  # input 0 is the branch index
                    add(eqn.invars[i], b_cts[i - 1], b_sel[i - 1], b_bad[i - 1])
            continue
        if name == "scan" and key + (n,) in primal.order:
            for i, c, s_, b in _reverse_scan(
                eqn, key + (n,), cts_out, out_sels, out_bads, primal, found, loc
            ):
                if i in diff:
                    add(eqn.invars[i], c, s_, b)
            continue
        if name in _FOLLOWED_CALLS:
            body, _ = body_of(eqn)
            body_cts, body_sel, body_bad = _reverse(
                body,
                key + (n,),
                cts_out,
                [sel.get(v, frozenset()) for v in eqn.outvars],
                primal,
                found,
                loc,
                [bad.get(v, frozenset()) for v in eqn.outvars],
            )
            for i in diff:
                add(eqn.invars[i], body_cts[i], body_sel[i], body_bad[i])
            continue
        cts_in = _eqn_vjp(eqn, invals, diff, cts_out)
        if name in _SELECTIONS:
            incoming = incoming | {(_SELECTIONS[name], loc)}
        made: list[Creation] = []
        if all(_finite(c) for c in cts_out if c is not None):
            made = _note_reverse(eqn, loc, invals, diff, cts_out, cts_in, incoming, found)
        elif name in ("max", "min") and came_bad:
            source = next(c for c in found if id(c) in came_bad)
            made = _note_reverse_exit(eqn, loc, invals, diff, cts_in, source, found)
        for i, c in zip(diff, cts_in):
            add(eqn.invars[i], c, incoming, came_bad | {id(m) for m in made})
    ins = [ct.get(v) for v in jaxpr.invars]
    sels = [sel.get(v, frozenset()) for v in jaxpr.invars]
    return ins, sels, [bad.get(v, frozenset()) for v in jaxpr.invars]


def _reverse_scan(eqn, key, cts_out, out_sels, out_bads, primal: _Primal, found, loc):
    """The cotangents of a ``scan``'s inputs, iteration by iteration in
    reverse, each body run on its own iteration's values: ``(input index,
    cotangent, selections, creations)`` per differentiable input."""
    body, _ = open_jaxpr(eqn.params["jaxpr"])
    n_consts, n_carry = scan_layout(eqn.params, len(eqn.invars))
    n_in = len(eqn.invars)
    carry_ct = list(cts_out[:n_carry])
    ys_ct = cts_out[n_carry:]
    consts_ct: list = [None] * n_consts
    xs_ct: list = [None] * (n_in - n_consts - n_carry)
    sels = [frozenset().union(*out_sels)] * n_in
    bads = [frozenset().union(*out_bads)] * n_in
    for i in reversed(primal.order[key]):
        outs_i = carry_ct + [None if y is None else y[i] for y in ys_ct]
        in_cts, in_sel, in_bad = _reverse(
            body,
            key + (i,),
            outs_i,
            [sels[0]] * len(outs_i),
            primal,
            found,
            loc,
            [bads[0]] * len(outs_i),
        )
        sels = [a | b for a, b in zip(sels, in_sel)]
        bads = [a | b for a, b in zip(bads, in_bad)]
        for j in range(n_consts):
            c = in_cts[j]
            if c is not None:
                consts_ct[j] = c if consts_ct[j] is None else consts_ct[j] + c
        carry_ct = [
            in_cts[n_consts + j]
            if in_cts[n_consts + j] is not None
            else _zeros_like_aval(body.invars[n_consts + j].aval)
            for j in range(n_carry)
        ]
        for j in range(len(xs_ct)):
            c = in_cts[n_consts + n_carry + j]
            if c is None:
                continue
            if xs_ct[j] is None:
                aval = eqn.invars[n_consts + n_carry + j].aval
                xs_ct[j] = np.zeros(aval.shape, np.dtype(aval.dtype))
            xs_ct[j][i] = np.asarray(c)
    cts = consts_ct + carry_ct + xs_ct
    return [(k, cts[k], sels[k], bads[k]) for k in range(n_in) if cts[k] is not None]


def _eqn_vjp(eqn, invals, diff, cts_out):
    def of_diff(*xs):
        full = list(invals)
        for i, x in zip(diff, xs):
            full[i] = x
        outs = bind_eqn(eqn, full)
        return [o for o, v in zip(outs, eqn.outvars) if _inexact(v.aval)]

    primals = [invals[i] for i in diff]
    float_cts = [c for c, v in zip(cts_out, eqn.outvars) if _inexact(v.aval)]
    try:
        _, vjp = jax.vjp(of_diff, *primals)
        return list(vjp(float_cts))
    except Exception as exc:  # an equation that refuses a cotangent of its own
        # Equinox's ``nondifferentiable_backward`` (in every optimistix solve)
        # raises on *any* cotangent, a zero one included; JAX's own grad never
        # hands it one (its cotangent is a symbolic zero).  An all-zero
        # cotangent carries nothing back, so the inputs' cotangents are zero.
        if all(np.all(np.asarray(c) == 0) for c in float_cts):
            return [jnp.zeros_like(p) for p in primals]
        raise RuntimeError(
            f"diagnose: the derivative of '{eqn.primitive.name}' cannot be taken on its "
            f"own at this point ({exc})"
        ) from exc


def _note_reverse_exit(eqn, loc, invals, diff, cts_in, came_bad: Creation, found):
    """``max``/``min`` multiply the cotangent by 0 for the operand they do
    not choose: an infinite cotangent arriving there (made by ``came_bad``
    downstream, on a lane the op discards) becomes NaN for that operand."""
    out = np.asarray(bind_eqn(eqn, invals)[0])
    made = []
    for i, c in zip(diff, cts_in):
        c = np.asarray(c)
        x = np.asarray(invals[i])
        if c.shape != out.shape or x.shape not in ((), out.shape):
            continue
        lanes = ~np.isfinite(c) & (np.broadcast_to(x, out.shape) != out)
        if lanes.any():
            made.append(
                _exit_record(eqn, loc, came_bad, lanes, _exit_examples(came_bad, out, lanes))
            )
    found.extend(made)
    return made


def _exit_record(eqn, loc, source: Creation, lanes, examples: list[str]) -> Creation:
    """A leak the selection ``eqn`` turned into NaN by multiplying the
    non-finite derivative ``source`` made by its zero coefficient."""
    return Creation(
        kind="leak",
        primitive=source.primitive,
        location=source.location,
        lanes=int(lanes.sum()),
        examples=examples,
        selections=[(_SELECTIONS[eqn.primitive.name], loc)],
        unknown=source.unknown,
    )


def _exit_examples(source: Creation, out, lanes) -> list[str]:
    """The source's examples at the lanes the selection discards: for a
    one-operand source fed by the selection (``acos(min(x, 1))``), its input
    there is the selection's output; otherwise the source's own examples."""
    if source.examples and all("," not in e for e in source.examples):
        values = np.asarray(out)[lanes][:_EXAMPLES]
        return list(dict.fromkeys(f"{source.primitive}({_num(v)})" for v in values))
    return list(source.examples)


def _note_reverse(eqn, loc, invals, diff, cts_out, cts_in, selections, found):
    """Record the lanes where this equation created a non-finite cotangent;
    returns the records."""
    made: list[Creation] = []
    float_outs = [c for c, v in zip(cts_out, eqn.outvars) if _inexact(v.aval)]
    lane_wise = len(float_outs) == 1
    for c in cts_in:
        bad = ~np.isfinite(np.asarray(c))
        if not bad.any():
            continue
        incoming = np.asarray(float_outs[0]) if lane_wise else None
        if incoming is not None and incoming.shape == bad.shape:
            zero = bad & (incoming == 0)
            nonzero = bad & (incoming != 0)
        else:  # lanes do not line up (a reduction, a contraction)
            any_zero = any(np.any(np.asarray(o) == 0) for o in float_outs)
            zero, nonzero = (bad, bad & False) if any_zero else (bad & False, bad)
        for kind, lanes in (("leak", zero), ("genuine", nonzero)):
            if lanes.any():
                record = Creation(
                    kind=kind,
                    primitive=eqn.primitive.name,
                    location=loc,
                    lanes=int(lanes.sum()),
                    examples=_examples(eqn, invals, lanes),
                    selections=sorted(selections) if kind == "leak" else [],
                    unknown=eqn.primitive.name not in RULES,
                )
                found.append(record)
                made.append(record)
    return made


def _forward(jaxpr, key, args, tangents, primal: _Primal, found, where: str = "", in_bad=None):
    """Tangents of ``jaxpr``'s outputs and the creations their non-finite
    lanes came from, recording creations: a non-finite tangent made from
    finite ones, and (the forward-mode leak) a non-finite tangent multiplied
    by a selection's zero coefficient (``max``/``min``)."""
    tan: dict = {}
    bad: dict = {}
    for k, (v, t) in enumerate(zip(jaxpr.invars, tangents)):
        if t is not None:
            tan[v] = t
            if in_bad and in_bad[k]:
                bad[v] = in_bad[k]
    for n, eqn in enumerate(jaxpr.eqns):
        invals = [primal.read(key, v) for v in eqn.invars]
        diff = [i for i, v in enumerate(eqn.invars) if not isinstance(v, Literal) and v in tan]
        if not diff:
            continue
        name = eqn.primitive.name
        loc = eqn_location(eqn) or where
        came_bad = frozenset().union(*(bad.get(eqn.invars[i], frozenset()) for i in diff))
        body = None
        skip = 0
        if name in _FOLLOWED_CALLS:
            body, _ = body_of(eqn)
        elif name == "cond" and key + (n,) in primal.taken:
            body, _ = open_jaxpr(eqn.params["branches"][primal.taken[key + (n,)]])
            skip = 1  # the branch index has no tangent
        if body is not None:
            body_t = [tan.get(v) if not isinstance(v, Literal) else None for v in eqn.invars[skip:]]
            body_bad = [
                bad.get(v, frozenset()) if not isinstance(v, Literal) else frozenset()
                for v in eqn.invars[skip:]
            ]
            outs_t, outs_bad = _forward(
                body, key + (n,), invals[skip:], body_t, primal, found, loc, body_bad
            )
        else:
            outs_t = _eqn_jvp(eqn, invals, diff, [tan[eqn.invars[i]] for i in diff])
            tin = [np.asarray(tan[eqn.invars[i]]) for i in diff]
            made: list[Creation] = []
            if all(np.all(np.isfinite(t)) for t in tin):
                made = _note_forward(eqn, loc, invals, tin, outs_t, found)
            elif name in ("max", "min") and came_bad:
                source = next(c for c in found if id(c) in came_bad)
                made = _note_forward_exit(eqn, loc, invals, diff, tin, outs_t, source, found)
            outs_bad = [came_bad | {id(m) for m in made}] * len(outs_t)
        for v, t, b in zip(eqn.outvars, outs_t, outs_bad):
            if t is not None and not _is_drop(v) and _inexact(v.aval):
                tan[v] = t
                if b and not _finite(t):
                    bad[v] = b
    outs = [tan.get(v) if not isinstance(v, Literal) else None for v in jaxpr.outvars]
    outs_bad = [
        bad.get(v, frozenset()) if not isinstance(v, Literal) else frozenset()
        for v in jaxpr.outvars
    ]
    return outs, outs_bad


def _eqn_jvp(eqn, invals, diff, tangents):
    def of_diff(*xs):
        full = list(invals)
        for i, x in zip(diff, xs):
            full[i] = x
        return bind_eqn(eqn, full)

    primals = [invals[i] for i in diff]
    tangents = [jnp.asarray(t, dtype=jnp.result_type(p)) for t, p in zip(tangents, primals)]
    _, outs_t = jax.jvp(of_diff, primals, tangents)
    return list(outs_t)


def _note_forward(eqn, loc, invals, tin, outs_t, found) -> list[Creation]:
    made: list[Creation] = []
    for t in outs_t:
        t = np.asarray(t)
        if not np.issubdtype(t.dtype, np.inexact):
            continue
        bad = ~np.isfinite(t)
        if not bad.any():
            continue
        same = [x for x in tin if x.shape == bad.shape]
        zero = bad & np.all([x == 0 for x in same], axis=0) if same else bad & False
        for kind, lanes in (("leak", zero), ("genuine", bad & ~zero)):
            if lanes.any():
                made.append(
                    Creation(
                        kind=kind,
                        primitive=eqn.primitive.name,
                        location=loc,
                        lanes=int(lanes.sum()),
                        examples=_examples(eqn, invals, lanes),
                        unknown=eqn.primitive.name not in RULES,
                    )
                )
    found.extend(made)
    return made


def _note_forward_exit(eqn, loc, invals, diff, tin, outs_t, source: Creation, found):
    """``max``/``min`` multiply a losing operand's tangent by 0: a non-finite
    tangent there (made by ``source``) becomes NaN in the output although
    the value ignores that operand."""
    out = np.asarray(bind_eqn(eqn, invals)[0])
    t_out = np.asarray(outs_t[0])
    made: list[Creation] = []
    for i, t in zip(diff, tin):
        x = np.broadcast_to(np.asarray(invals[i]), out.shape)
        t = np.broadcast_to(t, out.shape)
        lanes = (x != out) & ~np.isfinite(t) & ~np.isfinite(t_out)
        if lanes.any():
            # the source is upstream here: its own examples are its inputs
            made.append(_exit_record(eqn, loc, source, lanes, list(source.examples)))
    found.extend(made)
    return made


def _examples(eqn, invals, lanes) -> list[str]:
    """``sqrt(0.0)``: the primitive at the first offending lanes' inputs
    (operands that broadcast are read at their only value)."""
    idx = np.argwhere(lanes)[:_EXAMPLES]
    out = []
    for pos in idx:
        parts = []
        for x in invals:
            a = np.asarray(x)
            if a.ndim == 0:
                parts.append(_num(a))
            elif a.shape == lanes.shape:
                parts.append(_num(a[tuple(pos)]))
            else:
                parts.append(f"<{a.dtype}{list(a.shape)}>")
        out.append(f"{eqn.primitive.name}({', '.join(parts)})")
    return list(dict.fromkeys(out))


def _num(a) -> str:
    v = a.item() if hasattr(a, "item") else a
    if isinstance(v, float):
        if not np.isfinite(v):
            return str(v)
        return f"{v:.1f}" if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
    return str(v)


def _merged(found: list[Creation]) -> list[Creation]:
    """One record per (kind, primitive, location, selections)."""
    merged: dict = {}
    for c in found:
        key = (c.kind, c.primitive, c.location, tuple(c.selections))
        if key in merged:
            m = merged[key]
            m.lanes += c.lanes
            m.examples = list(dict.fromkeys(m.examples + c.examples))[:_EXAMPLES]
        else:
            merged[key] = c
    return list(merged.values())


def _ones(x):
    x = jnp.asarray(x)
    return jnp.ones_like(x) if jnp.issubdtype(x.dtype, jnp.inexact) else None


def _zeros_like_aval(aval):
    if not _inexact(aval):
        return None
    return jnp.zeros(aval.shape, aval.dtype)


def _inexact(aval) -> bool:
    return is_inexact_aval(aval)


def _finite(x) -> bool:
    return bool(np.all(np.isfinite(np.asarray(x))))


def _is_drop(v) -> bool:
    return type(v).__name__ == "DropVar"
