"""A device timeline: ordered asynchronous work on one IREE semaphore, and what it keeps alive.

Every piece of work waits for the timeline's current value and signals the next
(IREE's coarse-fences model), so work submitted to one timeline runs in order.
The timeline holds a reference to everything a submission reads or writes (device
buffers, the host arrays imported into them, tables) until the semaphore has passed
it: what a caller destroys or drops meanwhile stays alive for the queued work.
"""
from __future__ import annotations

import collections
import threading
import time

import iree.runtime as rt

__all__ = ["Timeline"]

# A CPU timeline sleeps through this share of a submission's expected duration (the fastest
# recent run) before it polls (for work expected to take _BLOCKING_BELOW_S or more; never more
# than 1 s at once).  0.9 rather than 0.8: the polls' wake-ups take a core from the task workers (grid
# sampler forward 2x30x250x370, 2 threads, alternating in one process: 3.83-4.05 ms at 0.8,
# 3.72-3.92 at 0.9, 3.72-3.89 at 0.95).
_PRESLEEP_SHARE, _PRESLEEP_MAX_S = 0.9, 1.0
# A submission found finished at the first look after its presleep took at most the observed
# time, not that time: recording it would keep the estimate at the presleep plus its overshoot
# (a fixed point near overshoot / (1 - share), about 1.5 ms here, whatever the kernel takes:
# a 1.1 ms kernel took 1.6-2.7 ms per call).  Such a run shrinks the estimate by this factor
# instead, until a presleep ends before the work does and the polls time it.
_CENSORED_SHRINK = 0.85
# A submission expected to take under this long (timed before) gets a blocking fence wait
# instead: whole training steps through the torch layer, alternating both ways in one process
# (2-vCPU Xeon, three runs): bicubic 4x16x64^2 2.57 -> 2.00 ms, up_down 2.5 -> 1.8-1.9,
# up_mixed 5.5-10.6 -> 5.5-5.8, the rest level; a 4 ms bound made the largest steps slower
# (border_ac 7.3 -> 8.7 ms), as a blocking wait on long calls always did (see _sleep_until).
_BLOCKING_BELOW_S = 2e-3


class _Ticket:
    """One submission's state: the value it took (0: none yet) and, non-empty once the work
    is on the device queue, `queued`."""

    __slots__ = ("value", "queued", "why")

    def __init__(self):
        self.value = 0
        self.queued = []
        self.why = "interrupted"


class Timeline:
    """Ordered work on one device: one semaphore, a counter, and the objects in flight.

    Thread-safe: several threads may submit to one timeline; the order of their
    submissions is the order in which the semaphore values were taken.
    """

    def __init__(self, device):
        self.device = device
        self.semaphore = device.hal.create_semaphore(0)
        self.value = 0  # the value the last submission signals
        # Reentrant: a signal handler runs on the thread it interrupts, at a call or a backward
        # jump of the code there, which may hold this lock (_prune's loop); a handler's call into
        # this timeline then goes on, where a plain lock waited for itself forever.  _take holds
        # it with neither, so no handler runs between its reading and its advancing the value.
        self._lock = threading.RLock()
        self._inflight = collections.deque()  # (signal value, objects the work touches), in order
        self._expect = None  # (signal value, launch time, Estimate) of the last timed submission
        self._owed = collections.deque()  # _Tickets of interrupted submissions, oldest first
        self._settle_lock = threading.RLock()
        # {thread id: its last _Ticket from submit or run_synchronous}: a signal handler's call on
        # a thread whose own submission took its value and has not queued yet would wait for
        # that one forever (its work waits for the value before its own); it is refused instead
        self._queuing = {}
        # A synchronous device's work has run when its queueing call returns: nothing to keep.
        self._keeps = not device.synchronous

    def next_fences(self, keep=()):
        """(wait fence, signal fence, signal value) for the next piece of work, advancing the
        timeline; `keep` stays referenced until the semaphore reaches the signal value.  The
        caller must then queue work that signals it (submit() does, whatever happens)."""
        self._prune()
        ticket = _Ticket()
        self._take(ticket, keep)
        v = ticket.value
        return rt.HalFence.create_at(self.semaphore, v - 1), rt.HalFence.create_at(self.semaphore, v), v

    def _take(self, ticket, keep, queuing=False):
        """Advances the timeline by one value for `ticket` (recorded in the same statement, so
        no signal handler runs between the two); `keep` stays referenced until it is reached.
        `queuing`: the caller queues the work itself next (submit, run_synchronous); raises
        RuntimeError where this thread's previous such submission took its value and has not
        queued yet (this call is a signal handler's, run in the middle of it: its work would
        wait for that value, which comes only after the handler returns)."""
        me = threading.get_ident() if queuing else None
        with self._lock:  # no calls and no loops in here (see __init__)
            taken = self._queuing
            prior = taken[me] if queuing and me in taken else None
            refused = prior is not None and prior.value and not prior.queued and prior not in self._owed
            if not refused:
                v = self.value + 1
                if keep and self._keeps:
                    self._inflight += ((v, keep),)
                if queuing:
                    taken[me] = ticket
                self.value = ticket.value = v
        if refused:
            raise RuntimeError("called from a signal handler while this thread's own call on the same stream was "
                               "being queued: it would wait for that call forever")

    @staticmethod
    def _queue(ticket, call):
        """Makes the queueing call (function, *arguments) and records it in `ticket` in one C
        call (list.extend over map): no signal handler runs between the two."""
        fn, *args = call
        ticket.queued.extend(map(fn, *([a] for a in args)))

    def submit(self, enqueue, keep=(), estimate=None) -> int:
        """Enqueues one piece of work and returns its signal value without waiting.

        enqueue(wait, signal): prepares the work (a kernel launch, a fill) to start when
        `wait` is reached and to signal `signal` when done, and returns the one call that
        puts it on the device queue, as (function, *arguments); submit makes that call.
        keep: everything the work touches, referenced until it has run.
        estimate: an object with `.seconds` (how long such work took before, or None)
        and `.record(seconds)`, which lets synchronize() sleep through most of it.

        Whatever is raised, a KeyboardInterrupt from a signal handler at any point included,
        the value this submission took is signalled: by the work when it reached the queue,
        else by an empty submission in its place (or, if even that cannot be queued, by
        failing the timeline, so that later work reports the failure instead of waiting
        forever); the exception propagates.  Signal handlers run only between bytecodes at
        calls and backward jumps, so the value is taken and recorded in one statement, and
        the queueing call and its record are one C call (list.extend over map).
        """
        if self._owed:
            self._settle()
        self._prune()
        v, _, launched = self._take_and_queue(enqueue, keep)
        if estimate is not None:
            with self._lock:
                self._expect = (v, launched, estimate)
        return v

    def run_synchronous(self, enqueue):
        """submit() on a synchronous device (local-sync: a launch runs its work before its
        queueing call returns), returning the submission's signal fence, which is reached (its
        wait() raises if the work failed) instead of a value to synchronize() on: what a
        repeated small call does (the layers run those inline), without the bookkeeping of
        work in flight (a synchronous device keeps nothing) and of estimates (nothing to sleep
        through).  `enqueue` and the guarantees when interrupted as for submit(); raises what
        queueing the work raised."""
        if self._owed:
            self._settle()
        return self._take_and_queue(enqueue, ())[1]

    def _take_and_queue(self, enqueue, keep):
        """submit()'s and run_synchronous()'s taking of the next value and queueing of the work
        (`enqueue`, `keep` as for submit), with their guarantee when interrupted; returns (the
        value, its signal fence, perf_counter() just before the queueing call)."""
        ticket = _Ticket()
        try:
            self._take(ticket, keep, queuing=True)
            v = ticket.value
            wait = rt.HalFence.create_at(self.semaphore, v - 1)
            signal = rt.HalFence.create_at(self.semaphore, v)
            launched = time.perf_counter()
            self._queue(ticket, enqueue(wait, signal))
        except BaseException as e:
            # Recorded before any call of the handler: a second interrupt may come at the next one.
            if ticket.value and not ticket.queued:
                self._owed.append(ticket)
                ticket.why = f"{type(e).__name__}: {e}"
                self._settle()
            raise
        return v, signal, launched

    def _settle(self):
        """Signals every value that a submission took and could not queue (see submit), in
        order, with an empty submission each; fails the timeline where even that cannot be
        queued.  Interrupted itself, it leaves the rest owed to the next submit or wait."""
        with self._settle_lock:
            while self._owed:
                ticket = self._owed[0]
                if not ticket.queued:
                    signal = rt.HalFence.create_at(self.semaphore, ticket.value)
                    try:
                        self._queue(ticket, self.device.fill_call(
                            (), rt.HalFence.create_at(self.semaphore, ticket.value - 1), signal))
                    except Exception as e:
                        signal.fail(f"{ticket.why}; the empty submission in its place failed too: {e}")
                        ticket.queued.append(None)
                self._owed.popleft()

    def completed(self) -> int:
        """The last value the semaphore has reached (raises if the timeline failed)."""
        return self.semaphore.query()

    def _prune(self):
        if not self._inflight:  # nothing kept: no need to ask the device (most synchronous calls)
            return
        try:
            done = self.completed()
        except Exception:  # a failed timeline: keep everything until synchronize
            return
        with self._lock:
            while self._inflight and self._inflight[0][0] <= done:
                self._inflight.popleft()

    def synchronize(self):
        """Blocks until all work submitted so far has finished (raises if it failed)."""
        if self._owed:
            self._settle()
        with self._lock:
            v = self.value
            expect, self._expect = self._expect, None
        if self.device.synchronous:  # its launches ran inside their calls: only a failure to report
            if self.semaphore.query() >= v:  # raises if the timeline failed
                self._prune()
                return
        if expect is not None and expect[0] != v:
            expect = None  # later work was submitted after it: its estimate says nothing
        seconds = expect[2].seconds if expect is not None else None
        slept = done_at_once = False
        # CPU devices poll (after a presleep where the call was timed before), except for a call
        # timed at under _BLOCKING_BELOW_S: the fence wait below blocks for that one
        if self.device.is_host and (seconds is None or seconds >= _BLOCKING_BELOW_S):
            if seconds is not None:
                left = expect[1] + _PRESLEEP_SHARE * seconds - time.perf_counter()
                if left > 0:
                    time.sleep(min(left, _PRESLEEP_MAX_S))
                    slept = True
            done_at_once = self._sleep_until(v)
        rt.HalFence.create_at(self.semaphore, v).wait()  # at once after the polls; raises on failure
        if self.device.is_host and expect is not None:
            took = time.perf_counter() - expect[1]
            if slept and done_at_once:  # finished during the presleep: `took` only bounds it
                took = _CENSORED_SHRINK * min(took, seconds)
            expect[2].record(took)
        self._prune()

    def _sleep_until(self, value):
        """CPU devices: poll the semaphore, for 30 us and then with short, growing sleeps
        (20 us to 200 us).
        Measured on a 2-core VM: a blocking fence wait often returned only on the next
        4 ms scheduler tick after a 2 ms kernel had finished (the woken thread queued behind
        a task worker), while polling finished within 0.2 ms of it; the waiting thread
        still sleeps, so the workers keep both cores.  A submission that was timed before
        is first slept through for most of its duration (each wake-up takes a core from the
        task workers: 8-10 % of a 3-4 ms call on 2 cores).  Returns whether the work had
        finished at the first look."""
        delay, spin_until = 2e-5, time.perf_counter() + 3e-5  # tiny calls: a 30 us spin first
        first = True
        while True:
            try:
                if self.completed() >= value:
                    return first
            except Exception:  # a failed timeline: the fence wait reports it
                return first
            first = False
            if time.perf_counter() < spin_until:
                continue
            time.sleep(delay)
            delay = min(delay * 1.5, 2e-4)

    def __repr__(self):
        return f"Timeline(device={self.device.name}, value={self.value})"
