"""One module per workload; each exports ``WORKLOAD`` (a :class:`base.Workload`)."""

from benchmarks.workloads import (
    attention,
    elementwise,
    lennard_jones,
    mlp,
    transformer,
    transformer_2layer,
)

ALL = [
    elementwise.WORKLOAD,
    lennard_jones.WORKLOAD,
    mlp.WORKLOAD,
    attention.WORKLOAD,
    transformer.WORKLOAD,
    transformer_2layer.WORKLOAD,
]
