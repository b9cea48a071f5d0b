"""Round-trip time estimate (RFC 6298's SRTT/RTTVAR) for deciding when a query is "slow"."""

from __future__ import annotations


class RttEstimator:
    """Smoothed RTT and its variation over all answered requests; fed samples in seconds."""

    def __init__(self, initial: float = 0.25) -> None:
        self.srtt: float | None = None
        self.rttvar = initial / 2
        self.initial = initial

    def sample(self, rtt: float) -> None:
        if self.srtt is None:
            self.srtt, self.rttvar = rtt, rtt / 2
        else:
            self.rttvar = 0.75 * self.rttvar + 0.25 * abs(self.srtt - rtt)
            self.srtt = 0.875 * self.srtt + 0.125 * rtt

    def slow_after(self, floor: float, ceiling: float) -> float:
        """How long an unanswered request may run before a lookup stops waiting for it."""
        estimate = self.initial if self.srtt is None else self.srtt + 4 * self.rttvar
        return min(ceiling, max(floor, estimate))
