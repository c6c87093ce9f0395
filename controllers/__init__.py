"""Control laws for Actuator: PID, the PID-Lagrangian constraint law, extremum seeking (maximise a
probe), a follower (the knob follows a probe through a monotone schedule), split-range control (one
output, two knobs), and the baselines they are compared against.

Standard library only -- no I/O, no clock, no logging, no numpy/torch -- so the same code runs
in the service, in the ``simulate`` endpoint, in benchmarks and in tests, and every decision can
be replayed from stored state. ``dt`` is always an argument and state is always returned.
"""

from ._checks import ParameterError
from .baselines import (
    AdaptiveKLController,
    AdaptiveKLState,
    FixedSchedule,
    KLAdaptiveLR,
    PlateauState,
    ReduceLROnPlateau,
)
from .extremum import ExtremumConfig, ExtremumOutput, ExtremumSeeking, ExtremumState, MaximizeLaw
from .feedforward import KLStart, kl_coefficient_for_target
from .follow import Follow, FollowConfig, FollowLaw, FollowOutput, check_schedule, schedule_at
from .filters import (
    EMA,
    EMAState,
    Filter,
    FilterKind,
    Median,
    MedianState,
    Passthrough,
    PassthroughState,
    make_filter,
)
from .lagrangian import ConstraintLaw, PIDLagrangian, lagrangian_config
from .law import Law, LawBase, LawOutput, Reading
from .pid import PID, Direction, LimitReason, PIDConfig, PIDOutput, PIDState, Scale, SetpointLaw
from .registry import At, LawKind, Registration, register, registration, registrations
from .setpoint import Setpoint, setpoint_at, validate_setpoint
from .split_range import Leg, SplitRange, SplitRangeConfig, SplitRangeError, SplitRangeLaw, SplitRangeOutput

__all__ = [
    "ParameterError",
    # the law seam: one protocol, one output, one registry
    "Law",
    "LawBase",
    "LawOutput",
    "Reading",
    "At",
    "LawKind",
    "Registration",
    "register",
    "registration",
    "registrations",
    "SetpointLaw",
    "ConstraintLaw",
    "MaximizeLaw",
    "FollowLaw",
    "SplitRangeLaw",
    # pid
    "PID",
    "PIDConfig",
    "PIDState",
    "PIDOutput",
    "Scale",
    "Direction",
    "LimitReason",
    # constraint (multiplier) law
    "PIDLagrangian",
    "lagrangian_config",
    # maximiser
    "ExtremumSeeking",
    "ExtremumConfig",
    "ExtremumState",
    "ExtremumOutput",
    # follower (knob = f(probe))
    "Follow",
    "FollowConfig",
    "FollowOutput",
    "check_schedule",
    "schedule_at",
    # filters
    "Filter",
    "FilterKind",
    "EMA",
    "EMAState",
    "Median",
    "MedianState",
    "Passthrough",
    "PassthroughState",
    "make_filter",
    # split range (one output, two knobs)
    "SplitRange",
    "SplitRangeConfig",
    "SplitRangeError",
    "SplitRangeOutput",
    "Leg",
    # setpoint
    "Setpoint",
    "setpoint_at",
    "validate_setpoint",
    # feedforward
    "KLStart",
    "kl_coefficient_for_target",
    # baselines
    "AdaptiveKLController",
    "AdaptiveKLState",
    "ReduceLROnPlateau",
    "PlateauState",
    "KLAdaptiveLR",
    "FixedSchedule",
]
