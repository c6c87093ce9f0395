"""Checks at ``train()`` start that say, with the arithmetic, when a run cannot be controlled.

A controller acts on a probe reading after the step-0 baseline, and its decision applies at the
step boundary after the answer comes back. A run whose probes come too rarely for its length
trains open loop while its owner believes it is controlled: that must be said before step 1.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import urlsplit

from actuator._exceptions import ConfigError
from actuator.policy import PolicyDocument

__all__ = ["check_url", "late_first_decisions", "ramp_beyond_run"]


def check_url(url: str, *, field: str = "url") -> str:
    """The controller's base URL, checked before training: a typo here would otherwise train the
    whole run uncontrolled behind one "unreachable" line. Returns it without a trailing slash."""
    text = url.strip()
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"{field}: {url!r} is not an http(s) URL of the controller; write it with its scheme, "
                          f"e.g. http://127.0.0.1:8000")
    try:
        parts.port  # noqa: B018 - urlsplit parses the port lazily; a bad one raises here
    except ValueError as exc:
        raise ConfigError(f"{field}: {url!r} has a bad port ({exc})") from None
    path = parts.path.rstrip("/")
    if path.endswith("/v1") or "/v1/" in path + "/":
        raise ConfigError(f"{field}: {url!r} ends in the API's /v1 prefix; give the service's base URL "
                          f"({parts.scheme}://{parts.netloc}{path[: path.rfind('/v1')]}): the agent adds /v1/... itself")
    if parts.query or parts.fragment:
        raise ConfigError(f"{field}: {url!r} carries a query or fragment; give the service's base URL")
    return text.rstrip("/")


def late_first_decisions(policy: PolicyDocument, probe_every: Mapping[str, int | None], *, max_steps: int,
                         start_step: int = 0, free_from: Mapping[str, int] | None = None) -> list[str]:
    """One message per controller whose first decision can only apply after the run's last step.

    ``probe_every``: how often each probe this run was given runs, as the callback scheduled it (a
    stored or written policy's ``probes[].every``, a preset's fitted to the run unless the probe's
    own ``every=`` was given). ``free_from``: knob → the first step at which a decision on it can
    apply (identification holds it until then; decisions before are set aside).
    """
    if max_steps <= 0:
        return []  # an epoch-based run whose length the trainer has not fixed: nothing to say
    every = dict(probe_every)
    free = dict(free_from or {})
    out = []
    for c in policy.controllers:
        if c.probe not in every:
            continue  # a probe the run was not given: the callback warns about that on its own
        interval = every[c.probe]
        knobs = c.driven()  # a split_range controller drives its two legs' knobs
        named = " / ".join(knobs)
        head = f"controller {c.name!r} ({c.probe} -> {named})"
        if not interval:
            out.append(f"{head}: probe {c.probe} has no schedule (every=None), so after the baseline at step "
                       f"{start_step} it is never read during training and {named} is never changed. Give it "
                       f"every=N (N well under max_steps={max_steps})")
            continue
        # The first reading after the baseline, then one step boundary for the answer to apply.
        first_reading = (start_step // interval + 1) * interval
        held = min(free.get(k, 0) for k in knobs)  # a decision applies once any of its knobs is free
        earliest = max(first_reading + 1, held)
        if earliest <= max_steps:
            continue
        why = f"probe {c.probe} runs every {interval} steps, so the first reading after the baseline at step " \
              f"{start_step} comes at step {first_reading}"
        if held > first_reading + 1:
            why += f" and identification holds {named} until step {held}"
        out.append(f"{head}: max_steps={max_steps}, {why}; its first decision could apply at step {earliest} at "
                   f"the earliest, after the last step. This run trains WITHOUT control by it: probe more often "
                   f"(the policy's probes[].every, or the probe's every=) or train longer")
    return out


def ramp_beyond_run(policy: PolicyDocument, probe_every: Mapping[str, int | None], *, max_steps: int,
                    start_step: int = 0) -> list[str]:
    """One message per controller whose setpoint ramp ends after the run's last step: until its
    end the law holds a lower target than the setpoint (a KL held under it, a learning rate cut
    below target), so the run cannot reach the setpoint on the ramp. ``probe_every`` as for
    :func:`late_first_decisions`. The ramp's k-th update is the k-th reading after the baseline."""
    if max_steps <= 0:
        return []
    out = []
    for c in policy.controllers:
        ramp = getattr(c, "setpoint_ramp", 0.0) or 0.0
        interval = probe_every.get(c.probe) if c.probe else None
        if not ramp or not interval:
            continue
        first = start_step  # the baseline reading: the ramp's first update
        reached = first + math.ceil(ramp) * interval
        if reached <= max_steps:
            continue
        readings = max(0, (max_steps - first) // interval)
        share = min(1.0, readings / ramp)
        out.append(f"controller {c.name!r} ({c.probe} -> {' / '.join(c.driven())}): its setpoint ramp of {ramp:g} "
                   f"probe intervals x every {interval} steps reaches the setpoint at step {first} + {ramp:g} x "
                   f"{interval} = {reached}, after the last step (max_steps={max_steps}); at step "
                   f"{first + readings * interval} the setpoint in force is {share:.0%} of the way from the first "
                   f"reading to it, and the law acts against that lower target. Shorten setpoint_ramp (at most "
                   f"{readings} here), probe more often, or train longer")
    return out
