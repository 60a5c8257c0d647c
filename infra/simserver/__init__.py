"""The simulated inference engine: an OpenAI-compatible streaming server that behaves like
a continuous-batching engine (docs/simserver.md). Stdlib only; everything it returns is
labelled simulated."""

from infra.simserver.config import SimConfig
from infra.simserver.dist import IntDist
from infra.simserver.faults import FaultConfig
from infra.simserver.profiles import PROFILES, EngineProfile, get_profile
from infra.simserver.server import SimServer, serve
from infra.simserver.tokens import count_tokens

__all__ = [
    "PROFILES",
    "EngineProfile",
    "FaultConfig",
    "IntDist",
    "SimConfig",
    "SimServer",
    "count_tokens",
    "get_profile",
    "serve",
]
