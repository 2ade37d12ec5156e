"""The JAX front end: jaxpr in, guarded callable out."""
