"""Deprecated path of ``vgrpo_platform.ode_solvers`` (renamed: "sampling" read like ``vgrpo sample`` and the
prompt sampler). Importable for third-party adapters for one release; import ``ode_solvers`` instead."""

import warnings

from vgrpo_platform.ode_solvers import make_scheduler, solve_flow_ode

warnings.warn(
    "vgrpo_platform.sampling is deprecated; import vgrpo_platform.ode_solvers",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = ["make_scheduler", "solve_flow_ode"]
