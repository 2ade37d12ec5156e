"""Looking at what the guard did: ``explain`` (every guard site and every
unguarded one, text/JSON), ``dump`` (original vs guarded jaxpr/StableHLO/HLO
and a diff), ``compare`` (plain vs guarded outputs and gradients), for JAX and
TF functions alike.  The public names are re-exported by :mod:`hlo_guard`."""
