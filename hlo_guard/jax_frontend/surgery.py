"""The guarded jaxpr built by surgery: the program's own equations kept as
they are, guard and mask equations spliced in before the uses they guard,
and the result staged as one call (issue 17, item 3).

The interpreter (:mod:`interpreter`) re-evaluates every equation into the
jaxpr being traced -- copying an unchanged one still costs JAX's staging of
a fresh equation, and on a guard-dense program the rewrite took longer than
tracing the user's function.  JAX's own jaxpr passes (``pe.dce_jaxpr``,
``partial_eval_jaxpr_nounits``) instead build the new jaxpr from the old
one's equations.  So does this module, for the programs where the rewrite
only inserts guards:

1. Masks and guards are computed by the interpreter's own ``Scope`` (the same
   rules, resolvers and guard sharing), in a side trace whose "values" are
   tracers standing for the program's variables (:class:`VariableValues`):
   what they stage reads those variables directly.
2. Each staged equation is placed right after the last program equation
   whose result it reads (its *position*); a guard must be in place before
   the use it guards -- a mask that reads a value computed after that use
   (a predicate downstream of the guarded operation, which the interpreter
   computes on the side) cannot be, and the interpreter is used instead.
3. The guarded uses read the guards' results (``eqn.replace(invars=...)``);
   a forward-mode output guard renames its value for every later reader.
4. The new jaxpr is staged as one ``jit`` call (:func:`compat.bind_as_call`):
   its equations are not traced again.

An equation the rewrite must bind again -- a call or control-flow node with
a guarded body, a guarded contraction, an operand guarded at the output's
shape inside the operation's derivative -- is bound in the side trace as the
interpreter binds it, and its own equation dropped (its outputs renamed).

Where surgery cannot express the rewrite, :func:`evaluate_by_surgery`
returns None and the interpreter runs, named here so that the list is kept
in one place:

* value mode (a substitution per hazard, with its own safe points);
* effects in the program (effectful equations must run exactly once, in
  order, and a call's effects need their own bookkeeping), or a high-level
  primitive (jax 0.12's ``jnp.ldexp``: the jaxpr must be lowered to
  primitives before it is compiled, which a call's body is not);
* jax 0.10, which has no call inlined when lowering: the spliced jaxpr would
  be inlined while tracing by JAX's own ``inline_jaxpr_into_trace``, and
  measured that was slower than the interpreter's copying (10k-equation
  chain: 0.76 s against 0.58 s; ``benchmarks/RESULTS.md``, fifteenth
  session);
* not a plain jaxpr trace (eager evaluation, a JVP or batching trace: the
  interpreter re-binds there, which is what those transformations need), a
  tracer of an enclosing transformation among the program's constants, a
  mesh in context;
* a guard that could not be placed before its use (step 2), or a mask that
  needs a contraction's result before the program computes it where the
  contraction cannot take that side value as its primal (see below).

A mask that needs a value the program computes later (the second norm's
predicate in a transformer block decides which lanes of the first
projection are live) computes it on the side, as the interpreter does; a
contraction computed there is visited in its turn and bound again with the
side values as its primal (:mod:`shared_primal`), exactly as the
interpreter's gradient-mode evaluation binds it, so that the program
computes every matmul once.
"""

from __future__ import annotations

import heapq
from typing import Any

from jax.core import Tracer

from hlo_guard.jax_frontend import compat
from hlo_guard.jax_frontend.binding import eqn_context
from hlo_guard.jax_frontend.graph import DropVar, JaxprGraph, Literal
from hlo_guard.jax_frontend.plan import GuardPlan, plan_of
from hlo_guard.jax_frontend.shared_primal import contracts
from hlo_guard.jax_frontend.side_values import MISSING, ScopeValues
from passes.analysis import Analysis
from passes.masks import ALL

#: the name of the call a guarded program is staged as starts with this
CALL_PREFIX = "guarded_"


class VariableValues(ScopeValues):
    """The values a ``Scope`` reads, each a tracer of the side trace standing
    for the program's variable itself (:func:`compat.tracer_of`), so that
    what is staged from it reads that variable -- while the variable is
    defined before the equation being guarded (:attr:`frontier`).  A value
    defined later (a predicate downstream of the guarded operation, the
    result ``maximum``'s mask compares against) is computed on the side from
    gradient-stopped inputs, as the interpreter computes it."""

    def __init__(self, graph: JaxprGraph, trace):
        super().__init__(graph, [], [])
        self._trace = trace
        #: variables produced by equations before this one are available
        self.frontier = 0

    def known(self, var):
        found = self.env.get(var)
        if found is not None:
            return found
        prod = self.graph.producer(var)
        if prod is None or prod[0] < self.frontier:
            found = self.env[var] = compat.tracer_of(self._trace, var)
            return found
        return self.shadow.get(var, MISSING)


def evaluate_by_surgery(analysis: Analysis, consts, args, mode: str, name: str):
    """The guarded program's outputs, staged as one call built by surgery,
    or None where surgery does not apply (see the module docstring)."""
    trace = compat.plain_jaxpr_trace()
    if trace is None or mode != "gradient" or not compat.calls_kept_until_lowering():
        return None
    graph = analysis.graph
    if not isinstance(graph, JaxprGraph):
        return None
    jaxpr = graph.jaxpr
    if jaxpr.effects or getattr(jaxpr, "is_high", False):
        return None
    if any(isinstance(c, Tracer) for c in consts):
        return None
    if not all(compat.staged_in(a, trace) for a in args):
        return None
    plan = plan_of(analysis)
    spliced = _guards_in_side_trace(plan, mode)
    if spliced is None:
        return None
    new_jaxpr, new_consts = spliced
    outs = compat.bind_as_call(new_jaxpr, [*consts, *new_consts, *args], name)
    if outs is None:
        return None
    plan.record.finished.add(mode)
    return outs


def _guards_in_side_trace(plan: GuardPlan, mode: str) -> tuple[Any, list] | None:
    """Compute every guard in a side trace and splice its equations in:
    ``(jaxpr, added constants)``, or None when a guard could not be placed
    before its use.

    An equation the rewrite must bind again -- a call or control-flow node
    with a guarded body, a guarded contraction, an operation whose operand
    is guarded at the output's shape inside its derivative -- is bound in the
    side trace, as the interpreter binds it (the same ``Scope`` methods), and
    its original equation is dropped: its outputs are renamed to the new
    ones for every later reader."""
    from hlo_guard.jax_frontend.interpreter import Scope

    graph = plan.graph
    jaxpr = graph.jaxpr
    sites = plan.sites_for(mode)
    out_sites = plan.output_sites_by_node
    rebound = plan.rewritten_bodies(mode) | plan.guarded_contractions
    #: node -> its operands after guarding (tracers of the side trace, or atoms)
    guarded_operands: dict[int, list[Any]] = {}
    #: variable -> its new value (a forward-mode guard's, a re-bound node's),
    #: read by every later use
    renamed: dict[Any, Any] = {}
    renamed_at: dict[Any, int] = {}
    dropped: set[int] = set()
    with compat.side_trace() as side:
        if side is None:
            return None
        scope = Scope(plan.analysis, [], [], [ALL] * len(jaxpr.outvars), mode=mode)
        values = VariableValues(graph, side)
        scope.values = values
        # as the interpreter's gradient-mode evaluation: an equation whose
        # outputs a mask computed on the side takes them as its primal
        # (:mod:`shared_primal`), so that the program computes a contraction once
        values.sharing = True
        todo = sorted(set(sites) | set(out_sites) | rebound)
        heapq.heapify(todo)
        visited: set[int] = set()
        seen_side = 0
        while todo:
            node = heapq.heappop(todo)
            if node in visited:
                continue
            visited.add(node)
            eqn = graph.eqns[node]
            with eqn_context(eqn):
                node_sites = sites.get(node, ())
                values.frontier = node
                invals = [_side_value(v, renamed, values) for v in eqn.invars]
                wide = scope.guard_operands(node, eqn, node_sites, invals)
                shared = scope.shared_side(eqn)
                if node in rebound or wide or shared is not None:
                    outs = scope.bind_node(node, eqn, invals, wide, shared)
                    for ov, o in zip(eqn.outvars, outs):
                        if not isinstance(ov, DropVar):
                            renamed[ov] = values.env[ov] = o
                            renamed_at[ov] = node
                    dropped.add(node)
                elif node_sites:
                    # (an unguarded operand's tracer stands for its variable,
                    # or its renamed value: _atom reads either back)
                    guarded_operands[node] = invals
                values.frontier = node + 1
                for site in out_sites.get(node, ()):
                    ov = eqn.outvars[site.index]
                    y = renamed[ov] if ov in renamed else values.value(ov)
                    renamed[ov] = values.env[ov] = scope.guard_output(node, site, y)
                    renamed_at[ov] = node
            # the contractions a mask computed on the side since: each is
            # visited in its turn and takes the side values as its primal
            if len(values.shadow) > seen_side:
                side_vars = list(values.shadow)
                for var in side_vars[seen_side:]:
                    prod = graph.producer(var)
                    if prod is not None and prod[0] > node and contracts(graph.eqns[prod[0]]):
                        heapq.heappush(todo, prod[0])
                seen_side = len(side_vars)
        if _computed_a_contraction_on_the_side(graph, values, dropped):
            return None
        eqns, constvars, constvals = compat.staged_equations(side)
    if any(isinstance(c, Tracer) for c in constvals):
        return None
    return _splice(
        graph, eqns, constvars, constvals, guarded_operands, renamed, renamed_at, dropped
    )


def _computed_a_contraction_on_the_side(
    graph: JaxprGraph, values: VariableValues, replaced: set[int]
) -> bool:
    """Whether a mask needed a contraction's result before the program computes
    it and the program's equation could not take the side value as its primal
    (:func:`shared_primal.can_share`: an output that is not floating, an
    effect).  The program would compute that contraction twice, which XLA
    does not merge in a gradient program: the interpreter is used."""
    for var in values.shadow:
        prod = graph.producer(var)
        if prod is not None and prod[0] not in replaced and contracts(graph.eqns[prod[0]]):
            return True
    return False


def _side_value(atom, renamed, values: VariableValues):
    """An operand as the side trace reads it: a literal's value, a renamed
    variable's new value, else the tracer standing for the variable."""
    if isinstance(atom, Literal):
        return atom.val
    found = renamed.get(atom)
    return found if found is not None else values.value(atom)


_UNPLACEABLE = object()


def _atom(x, original):
    """The jaxpr atom a guard's result stands for: a side tracer's variable,
    the ``original`` atom for a value passed through unchanged (a literal
    operand's own value), else unplaceable."""
    if x is original:
        return original
    if isinstance(x, Tracer):
        return getattr(x, "val", _UNPLACEABLE)
    if isinstance(original, Literal) and x is original.val:
        return original
    return _UNPLACEABLE


def _splice(
    graph: JaxprGraph,
    side_eqns: list,
    constvars: list,
    constvals: list,
    guarded_operands: dict[int, list[Any]],
    renamed: dict,
    renamed_at: dict,
    dropped: set[int],
) -> tuple[Any, list] | None:
    """Place the side trace's equations after the last program equation each
    reads, point the guarded uses (and, for a forward-mode output guard, every
    later reader) at the guards' results: ``(jaxpr, added constants)``, or
    None when a guard would come after the use it guards."""
    jaxpr = graph.jaxpr
    n = len(jaxpr.eqns)
    #: side variable -> the index of the program equation it must follow
    position: dict[Any, int] = {v: 0 for v in constvars}

    def defined_after(atom) -> int:
        if isinstance(atom, Literal):
            return 0
        found = position.get(atom)
        if found is not None:
            return found
        prod = graph.producer(atom)
        return 0 if prod is None else prod[0] + 1

    before: dict[int, list[Any]] = {}
    for eqn in side_eqns:
        at = max((defined_after(v) for v in eqn.invars), default=0)
        for ov in eqn.outvars:
            position[ov] = at
        before.setdefault(at, []).append(eqn)
    renames = {}
    for v, x in renamed.items():
        atom = _atom(x, v)
        if atom is _UNPLACEABLE:
            return None
        if atom is v:
            continue
        if defined_after(atom) > renamed_at[v] + 1:
            return None
        renames[v] = atom
    operands_at: dict[int, list[Any]] = {}
    for node, operands in guarded_operands.items():
        atoms = [_atom(x, v) for x, v in zip(operands, graph.eqns[node].invars)]
        if any(a is _UNPLACEABLE for a in atoms):
            return None
        if any(not isinstance(a, Literal) and defined_after(a) > node for a in atoms):
            return None
        operands_at[node] = atoms
    new_eqns: list[Any] = []
    for k, eqn in enumerate(jaxpr.eqns):
        new_eqns.extend(before.get(k, ()))
        if k in dropped:
            continue
        reads: list[Any] | None = operands_at.get(k)
        if reads is None and renames:
            reads = [v if isinstance(v, Literal) else renames.get(v, v) for v in eqn.invars]
        if reads is not None and any(a is not v for a, v in zip(reads, eqn.invars)):
            eqn = eqn.replace(invars=reads)
        new_eqns.append(eqn)
    new_eqns.extend(before.get(n, ()))
    outvars = [v if isinstance(v, Literal) else renames.get(v, v) for v in jaxpr.outvars]
    invars = [*jaxpr.constvars, *constvars, *jaxpr.invars]
    return compat.jaxpr_with_inputs(jaxpr, invars, outvars, new_eqns), constvals


def spliced_program(closed):
    """The guarded program of a jaxpr traced from a guarded function (what
    ``jax.make_jaxpr(guard(f))`` returns), as one ``ClosedJaxpr``: the body
    of the one call surgery staged, its leading inputs (the constants passed
    in) closed over again -- or ``closed`` itself when the interpreter built
    it.  For reading the rewrite: counting guards, finding equations."""
    eqns = closed.jaxpr.eqns
    if len(eqns) != 1 or not str(eqns[0].params.get("name", "")).startswith(CALL_PREFIX):
        return closed
    call = eqns[0]
    body = call.params["jaxpr"].jaxpr
    n_consts = len(body.invars) - len(closed.jaxpr.invars)
    outer = dict(zip(closed.jaxpr.constvars, closed.consts))
    values = [a.val if isinstance(a, Literal) else outer.get(a, a) for a in call.invars[:n_consts]]
    return compat.close_leading_inputs(body, values)
