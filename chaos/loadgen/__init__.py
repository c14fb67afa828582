"""Open-loop HTTP load against a glassbox server: schedules, bodies, the generator and its result."""

from glassbox.chaos.loadgen.bodies import PROTOCOLS, Protocol, build_bodies
from glassbox.chaos.loadgen.generator import LoadConfig, LoadGenerator, classify_failure
from glassbox.chaos.loadgen.plan import PROFILES, Profile, RatePlan
from glassbox.chaos.loadgen.progress import Snapshot
from glassbox.chaos.loadgen.result import LoadResult
from glassbox.chaos.loadgen.texts import default_mix, read_texts

__all__ = [
    "PROFILES",
    "PROTOCOLS",
    "LoadConfig",
    "LoadGenerator",
    "LoadResult",
    "Profile",
    "Protocol",
    "RatePlan",
    "Snapshot",
    "build_bodies",
    "classify_failure",
    "default_mix",
    "read_texts",
]
