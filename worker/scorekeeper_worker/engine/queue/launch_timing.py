"""When to form the next batch while one runs on the device (pure; the scheduler feeds it what it measures).

Forming batch N+1 the moment N is launched would take only the requests queued by then: under a steady stream of
requests that is one request per batch, and the host pays its per-batch cost (packing, the heads, the GIL) for each.
A request that arrives while N runs waits for N either way, so N+1 is formed just in time instead: when the device
is expected to finish the work in flight, less the time the host needs to launch a batch. Requests that arrive
meanwhile join it, and the device still finds N+1 queued behind N. A full batch's worth of queued tokens is formed at
once (nothing more would fit).

Expected times come from what the device took: an average of its time per forward token (a bucket's tokens, or an
eager batch's), taken a little short so that a batch is launched early rather than late; until the first batch has
finished there is no estimate, and the next batch is formed at once."""

from __future__ import annotations

from dataclasses import dataclass

SMOOTHING = 0.2  # weight of the newest measurement in the running averages
EARLY = 0.9  # the device's expected time is taken this much short: launching early costs nothing, late idles it
MARGIN_SECONDS = 0.001  # on top of twice the host's launch time: the model thread may wait for the GIL to wake


@dataclass
class LaunchTiming:
    seconds_per_token: float = 0.0  # the device's time per forward token, averaged
    launch_seconds: float = 0.0  # the host's time to launch a batch, averaged
    device_free_at: float = 0.0  # when the work in flight is expected to be done

    def _average(self, current: float, measured: float) -> float:
        return measured if current == 0.0 else (1 - SMOOTHING) * current + SMOOTHING * measured

    def expected(self, tokens: int) -> float:
        """The device's expected time for a forward over `tokens` tokens."""
        return EARLY * self.seconds_per_token * tokens

    def launched(self, now: float, tokens: int, launch_seconds: float) -> None:
        """A batch of `tokens` forward tokens was enqueued at `now`, after `launch_seconds` on the host."""
        self.launch_seconds = self._average(self.launch_seconds, launch_seconds)
        self.device_free_at = max(now, self.device_free_at) + self.expected(tokens)

    def finished(self, now: float, tokens: int, device_seconds: float, tokens_in_flight: int) -> None:
        """A batch of `tokens` forward tokens took `device_seconds`; `tokens_in_flight` are still queued behind it."""
        if tokens > 0:
            self.seconds_per_token = self._average(self.seconds_per_token, device_seconds / tokens)
        self.device_free_at = max(self.device_free_at, now + self.expected(tokens_in_flight))

    def form_at(self) -> float:
        """When to form the next batch (now or earlier: at once)."""
        return self.device_free_at - 2 * self.launch_seconds - MARGIN_SECONDS
