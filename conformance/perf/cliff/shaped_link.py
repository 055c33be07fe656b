"""One link rate's DDP step on a token-bucket link (``tc tbf``), in the simulator's terms.

What the overlapped-step simulator (``maths.simulator``) does not know about a real shaped link:
its burst, refilled while the link is idle and paid from by each all-reduce; the buffers DDP
broadcasts before every forward; a message's latency split into the software's part and bytes
on the link (docs/ddp-background.md, "Scaling cliffs"). ``model`` builds one per rate of
a sweep and holds it to the measured step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ...harness.world import LinkShape
from ..maths import AlphaBeta, BackwardProfile


def burst_credit_s(rate: float | None) -> float:
    """Link time a token-bucket link gives back after an idle moment: its burst (as
    :class:`LinkShape` sizes it for ``rate``) crosses at line rate. A back-to-back all-reduce
    sweep never sees it (the bucket stays empty); a DDP step does, after its forward and
    backward left the link idle. 0 on the unshaped link."""
    if rate is None:
        return 0.0
    return LinkShape(rate_bits_per_s=rate).burst * 8 / rate


@dataclass(frozen=True, slots=True)
class HookTraffic:
    """What a DDP comm hook all-reduced per step, measured (``rank.hook_all_reduces``).

    The simulator's buckets are DDP's gradients; a hook sends something else in their place.
    Measured without it (examples/train_compressed.py, fp16_compress_hook): the slowest rates'
    steps were predicted 74-83 % slow, the hook sending half the bytes."""

    bytes: float
    calls: float


@dataclass(frozen=True, slots=True)
class ShapedLink:
    """One rate's DDP step on a token-bucket link, in the simulator's terms: the buckets'
    release times, their all-reduce latency and transfer parts (the rate's alpha-beta fit), and
    the link's burst (``credit_s``: :func:`burst_credit_s`).

    A tbf link lets ``burst`` bytes through at line rate after an idle moment: its bucket of
    tokens refills at the rate while the link is idle and is capped at the burst. In a training
    loop the link is idle from the end of one step's last all-reduce to the next step's first
    one -- the optimizer step and the loop's own cost (DDP's fixed cost, :func:`validate`), the
    forward, and backward up to the first bucket -- and between two buckets whose gradients
    are not ready yet. So the credit is not all or nothing: a step shorter than the burst (a
    small model: the mlp's whole step is ~1.4 ms, the default burst 1 ms of the rate) starts
    with a partly refilled bucket, and each all-reduce takes from what is there. The step is
    simulated until its start state repeats (the steady state a training loop reaches).

    ``between_s``: idle time outside the step, between one step and the next. 0 in a training
    loop; in the check's measurement the plain pass and the ranks' lining up (off the network)
    separate two timed steps, and the bucket refills through them too (:func:`between_steps`).
    Measured (mlp at 94 Mbit/s, 0.2 ms of compute, a 1.2 ms all-reduce): simulated without it
    the step started with 0.5 ms of tokens and was predicted 21-33 % long."""

    forward_s: float
    backward_end_s: float
    releases_s: tuple[float, ...]
    latencies_s: tuple[float, ...]
    transfers_s: tuple[float, ...]
    credit_s: float
    # DDP's broadcast of the module's buffers from rank 0 before every forward
    # (``broadcast_buffers=True``, the default): on the link, not overlapped with anything.
    broadcast_latency_s: float = 0.0
    broadcast_transfer_s: float = 0.0
    between_s: float = 0.0
    alpha_s: float = 0.0  # the fit's per-message latency the latencies above were made of
    world_size: int = 2
    # What a burst's bytes still take at line rate, as a share of their time at this rate
    # (:meth:`at_line_rate`): 0, the burst crosses at once.
    line_share: float = 0.0
    # How much earlier than the last rank the first rank readies a bucket (``launch_skew``): its
    # share of the all-reduce goes on the link then, and the idle link stops refilling.
    skew_s: float = 0.0

    @classmethod
    def of(cls, profile: BackwardProfile, layout: Sequence[Sequence[int]], fit: AlphaBeta, world_size: int,
           credit_s: float, *, buffer_bytes: int = 0, buffer_messages: int = 1, between_s: float = 0.0,
           hook: HookTraffic | None = None, skew_s: float = 0.0) -> ShapedLink:
        """``buffer_messages``: how many broadcasts carry the buffers (DDP coalesces them per
        dtype: a BatchNorm's float statistics and its int64 step counter are two). ``hook``:
        what a comm hook all-reduces instead of each bucket, as measured."""
        latency = 2 * (world_size - 1) * fit.alpha_s
        order = sorted(range(len(layout)), key=lambda b: max(profile.ready_s[i] for i in layout[b]))
        releases = [max(profile.ready_s[i] for i in layout[b]) for b in order]
        sent: list[float] = [sum(profile.nbytes[i] for i in layout[b]) for b in order]
        messages = 1.0
        if hook is not None:
            # The hook's all-reduces in place of each bucket's: its bytes and its calls spread
            # over the buckets as their gradients are (fp16 compression: half the bytes, one call
            # per bucket; PowerSGD: a few per cent of them, in two or three calls).
            factor = hook.bytes / max(sum(sent), 1)
            sent = [factor * b for b in sent]
            messages = hook.calls / max(len(layout), 1)
        comms = [messages * latency + max(fit.allreduce_time(b, world_size) - latency, 0.0) for b in sent]
        latency *= messages
        n = world_size
        # Every rank's traffic crosses the one shaped loopback: an all-reduce of M bytes puts
        # n * 2(n-1)/n * M bytes through it in 2(n-1)/n * M / beta seconds, so the link itself
        # carries n * beta; a broadcast puts (n-1) * B bytes through it.
        broadcast = (n - 1) * buffer_bytes / (n * fit.beta_bytes_per_s) if buffer_bytes and n > 1 else 0.0
        return cls(forward_s=profile.forward_s, backward_end_s=profile.backward_end_s,
                   releases_s=tuple(releases), latencies_s=tuple(min(latency, c) for c in comms),
                   transfers_s=tuple(max(c - latency, 0.0) for c in comms), credit_s=credit_s,
                   broadcast_latency_s=buffer_messages * (n - 1) * fit.alpha_s if broadcast else 0.0,
                   broadcast_transfer_s=broadcast, between_s=between_s, alpha_s=fit.alpha_s, world_size=n,
                   skew_s=skew_s)

    def with_unshaped_latency(self, unshaped_alpha_s: float) -> ShapedLink:
        """This link with each message's latency split at ``unshaped_alpha_s``, the unshaped
        link's latency (software: gloo's hand-offs, the kernel's loopback path): that part is
        latency at every rate; what a shaped rate's fit adds beyond it is paid like a transfer.

        Behind a slow link a message's latency is mostly bytes on the link: the TCP/IP headers
        of its packets and their acknowledgements, which the token bucket meters like data.
        Measured (convbn, 2 ranks): the fitted latency grew as the rate fell, 170 us at 84
        Mbit/s, 438 us at 21, 834 us at 10.5, 1673 us at 5.2 -- a steady ~1.1 kB per round of
        the all-reduce, in which both ranks send -- so after an idle moment the burst pays for it
        too. Kept as latency, the step's broadcasts and all-reduces were predicted 9-12 % slow
        at the slowest rate in every sweep. A broadcast's message is one rank's, a 1/N share of
        a round: charged a whole round, convbn's two broadcasts per step were predicted 19-20 %
        slow at its two slowest rates (21 sweeps), 1-2 % with the share.

        And no shaping takes the software's latency away: a shaped rate's fit that reads less
        (its intercept extrapolated under transfers of milliseconds) is raised to it. Measured
        (mlp, 21 sweeps): the fitted latency fell from 214 us unshaped to 103-145 us at
        134-537 Mbit/s, where the burst hides the whole transfer, and the step there was
        predicted 18-20 % fast."""
        if self.alpha_s <= 0 or unshaped_alpha_s <= 0 or unshaped_alpha_s == self.alpha_s:
            return self
        keep = unshaped_alpha_s / self.alpha_s
        if keep > 1:
            return replace(self, latencies_s=tuple(lat * keep for lat in self.latencies_s),
                           broadcast_latency_s=self.broadcast_latency_s * keep, alpha_s=unshaped_alpha_s)
        latencies = tuple(lat * keep for lat in self.latencies_s)
        # One latency of the fit is a round of the all-reduce, in which every rank sends a
        # message across the one shaped loopback; a broadcast's message is one rank's.
        broadcast_bytes = self.broadcast_latency_s * (1 - keep) / self.world_size
        return replace(self, latencies_s=latencies,
                       transfers_s=tuple(t + lat - kept for t, lat, kept in zip(self.transfers_s, self.latencies_s,
                                                                                latencies)),
                       broadcast_latency_s=self.broadcast_latency_s * keep,
                       broadcast_transfer_s=self.broadcast_transfer_s + broadcast_bytes,
                       alpha_s=unshaped_alpha_s)

    def at_line_rate(self, beta_bytes_per_s: float, unshaped_beta_bytes_per_s: float) -> ShapedLink:
        """This link with its burst crossing at the unshaped link's bandwidth, not at once.

        The burst lets bytes through without waiting for tokens, but no faster than the link
        itself carries them: on a rate near the unshaped link's the burst saves almost nothing.
        Measured (examples/train_compiled.py, a 2.2 MB all-reduce; the sweep's fastest rates,
        15-120 Gbit/s, carried 750-830 MB/s against 1.5 GB/s unshaped): with the burst taking
        the transfer away the step there was predicted 8-16 % fast in every run."""
        if beta_bytes_per_s <= 0 or unshaped_beta_bytes_per_s <= 0:
            return self
        return replace(self, line_share=min(1.0, beta_bytes_per_s / unshaped_beta_bytes_per_s))

    def _phase(self, tokens: float) -> tuple[float, float, float]:
        """(backward phase's end, the last all-reduce's end, tokens left) from backward's start
        with ``tokens`` seconds of line-rate credit."""
        free = 0.0  # when the link is next idle
        for release, latency, transfer in zip(self.releases_s, self.latencies_s, self.transfers_s):
            start = max(release, free)
            # Refilled while idle: until the first rank readies this bucket and sends its share,
            # the skew before the last rank does (the all-reduce completes after that one).
            tokens = min(self.credit_s, tokens + max(0.0, start - self.skew_s - free))
            paid = min(tokens, transfer)
            tokens -= paid
            free = start + latency + transfer - paid * (1 - self.line_share)
        return max(self.backward_end_s, free), free, tokens

    def _step(self, tokens: float) -> tuple[float, float, float, float]:
        """(the buffers' broadcast, the backward phase, the last all-reduce's end, tokens left)
        from the step's start with ``tokens`` of credit: the broadcast first (DDP waits for it
        before the forward), then the forward with the link idle, then backward."""
        paid = min(tokens, self.broadcast_transfer_s)
        broadcast = (self.broadcast_latency_s + self.broadcast_transfer_s - paid * (1 - self.line_share)
                     if self.broadcast_transfer_s else 0.0)
        tokens = min(self.credit_s, tokens - paid + self.forward_s)
        phase, comm_end, left = self._phase(tokens)
        return broadcast, phase, comm_end, left

    def step_s(self, overhead_s: float) -> float:
        """The predicted step (the buffers' broadcast, forward, the overlapped backward, DDP's
        fixed cost ``overhead_s``)."""
        tokens = self.credit_s  # a fresh link starts full; the loop below reaches the steady state
        broadcast, phase = 0.0, self.backward_end_s
        for _ in range(16):
            broadcast, phase, comm_end, left = self._step(tokens)
            # Idle from the last all-reduce's end to the next step's start.
            after = min(self.credit_s, left + (phase - comm_end) + overhead_s + self.between_s)
            if abs(after - tokens) <= 1e-9:
                break
            tokens = after
        return broadcast + self.forward_s + phase + overhead_s
