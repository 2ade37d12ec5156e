"""Primitives left without a rule on purpose, and why.

An operation without a rule is treated as fully live: no guard, JAX's own
derivative, and ``explain`` lists it as an unguarded site ("no rule for
primitive ...") whenever dead lanes reach it.  That is the conservative
default, never a silent one.  This list records which user-facing primitives
of the installed JAX are *meant* to stay that way, so that
``tests/test_rule_coverage.py`` can tell a deliberate gap from a forgotten
one (a new JAX primitive shows up there as unruled and unlisted).
"""

from __future__ import annotations

_LINALG = (
    "linear algebra: every input lane may feed every output lane and the "
    "derivative mixes them; kept fully live"
)
_COLLECTIVE = (
    "collective inside shard_map/pmap: lanes move between devices; a per-device "
    "mask cannot describe them, kept fully live"
)
_GENERIC_REDUCTION = (
    "generic reduction/window with a user computation: its structure is not known, kept fully live"
)
_OPAQUE = "opaque to the pass (foreign code or a user-defined rule); kept fully live"
_NO_FLOAT = "carries no floating-point derivative; nothing to guard"
_STATE = "mutable state (Refs) and effects: not followed; kept fully live"

CONSERVATIVE_ON_PURPOSE: dict[str, str] = {
    **{
        name: _LINALG
        for name in (
            "cholesky_update",
            "eig",
            "geqrf",
            "geqp3",
            "householder_product",
            "ormqr",
            "schur",
            "hessenberg",
            "tridiagonal",
            "tridiagonal_solve",
            "symmetric_product",
        )
    },
    **{
        name: _COLLECTIVE
        for name in (
            "psum",
            "pmax",
            "pmin",
            "all_gather",
            "all_to_all",
            "ppermute",
            "reduce_scatter",
            "psum_invariant",
            "all_gather_invariant",
            "pbroadcast",
            "ragged_all_to_all",
            "all_gather_reduced",
            "preduced",
            "unreduced_psum",
            "unreduced_reduce_scatter",
            "reduced_vary_cast_p",
            "vary_unreduced_cast_p",
            "psend",
            "precv",
            # asynchronous halves of the collectives above
            "all_gather_start",
            "all_gather_done",
            "all_gather_reduced_start",
            "all_to_all_start",
            "all_to_all_done",
            "pbroadcast_start",
            "pbroadcast_done",
            "ppermute_start",
            "ppermute_done",
            "psum_start",
            "psum_done",
            "psum_invariant_start",
            "reduce_scatter_start",
            "reduce_scatter_done",
            "unreduced_psum_start",
            "unreduced_reduce_scatter_start",
            # new in jax 0.11/0.12
            "pbroadcast_dynamic",
            "unreduced_pmax",
            "unreduced_pmin",
            "vary_unreduced_cast",
        )
    },
    **{
        name: _GENERIC_REDUCTION
        for name in (
            "reduce",
            "reduce_window",
            "select_and_scatter",
            "scatter-mul",
            "ragged_dot_general",
            "scaled_dot",
        )
    },
    **{
        name: _OPAQUE
        for name in (
            "pure_callback",
            "io_callback",
            "debug_callback",
            "ffi_call",
            "custom_linear_solve",
            "linear_call",
            "custom_partitioning",
            "custom_vmap_call",
            "custom_jvp_call_jaxpr",
            "custom_lin",
            "remat_opt",
            "call_exported",
            "composite",
            "compute_on",
            "call",
            "buffer_callback",
            "stage",
            "call_hi_primitive",
            "program_order",  # jax 0.11: a call that fixes the order of its effects
        )
    },
    **{
        name: _NO_FLOAT
        for name in (
            "debug_print",
            "inspect_sharding",
            "axis_index",
            "mulhi",
            "create_token",
            "after_all",
            "platform_index",
            "shape_assertion",
            "dim_as_value",
            "dimension_size",
            "check",
            "random_clone",
            "iota_2x32_shape",
            "threefry4x32",
            "philox2x32",
            "philox4x32",
            "empty",
            "empty2",
            "dce_sink",
            "tie",
            "xla_metadata_value",
            "to_edtype",
            "from_edtype",
            "unreachable",
        )
    },
    **{
        name: _STATE
        for name in (
            "get",
            "swap",
            "addupdate",
            "run_state",
            "new_ref",
            "empty_ref",
            "free_ref",
            "freeze",
            "accum_grad_in_ref",
        )
    },
}


#: Names the tables above (and the rule table) key on that only *some* of the
#: supported JAX releases (0.10.2 - 0.12.x) define: a primitive removed or
#: renamed in a later release stays listed for the releases that still have it.
#: ``tests/test_rule_coverage_tables.py`` accepts these as "not stale" on a JAX
#: that lacks them; every other name a table holds must exist.
ONLY_IN_SOME_VERSIONS: dict[str, str] = {
    "closed_call": "jax 0.10 (removed in 0.11: calls are `jit`)",
    "call": "jax 0.10",
    "shard_alike": "jax 0.10",
    "pbroadcast_start": "jax 0.10",
    "pbroadcast_done": "jax 0.10",
    "psum_start": "jax 0.10",
    "reduced_vary_cast_p": "jax 0.10 (named without the _p suffix later)",
    "vary_unreduced_cast_p": "jax 0.10 (`vary_unreduced_cast` from 0.11)",
    "unreduced_psum_start": "jax 0.10",
    "unreduced_reduce_scatter_start": "jax 0.10",
    "pbroadcast_dynamic": "jax 0.11+",
    "unreduced_pmax": "jax 0.11+",
    "unreduced_pmin": "jax 0.11+",
    "vary_unreduced_cast": "jax 0.11+",
    "relayout": "jax 0.11+",
    "log2": "jax 0.11+",
    "one_minus_square": "jax 0.11+",
    "polynomial": "jax 0.12+",
    "program_order": "jax 0.11 only",
}


#: Primitives defined outside JAX (by another library, or by hlo_guard itself),
#: which the rule table keys on: JAX's own list never holds them.
LIBRARY_PRIMITIVES: dict[str, str] = {
    "nondifferentiable_backward": "equinox.internal (every optimistix solve): the identity",
    # hlo_guard's own forward-mode output guard, met when a guarded program is
    # analysed again (hlo_guard/jax_frontend/tangent_guard.py)
    "tangent_guard": "hlo_guard: the identity; its JVP masks the tangent",
    "tangent_mask": "hlo_guard: a tangent masked by a select; transposes to cotangent_guard",
    "cotangent_guard": "hlo_guard: the identity on a cotangent; differentiates to a select",
}
