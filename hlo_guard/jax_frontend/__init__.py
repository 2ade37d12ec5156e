"""The JAX front end: jaxpr in, guarded callable out."""

import os as _os

from jax.extend import source_info_util as _source_info_util

# Frames inside hlo_guard are ours, not the user's: excluding them makes guards
# and re-bound equations carry the user's file:line in jaxprs and HLO metadata
# (and keeps the optimized HLO of a guarded function identical to the plain one).
_source_info_util.register_exclusion(_os.path.dirname(_os.path.dirname(__file__)))
