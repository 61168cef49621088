"""What the listener's peers can make an agent hold, per source.

A source is who sent a listener message. te notifications do not carry a
proven sender yet, so today the source is what the message claims: the te
segment of the agent whose metadata it pushes, or the segment a metadata
request wants its reply at (source_of). A peer with the cluster secret that
lies about it can spread over several sources; the totals (MAX_* in
nixl._agent) bound what all sources together hold. Once te hands the
receiver an authenticated sender, source_of returns that and each peer is
one source.

Sources: per source, the agents it announced and the ranges their metadata
holds (refused past the bounds, before anything is kept). Jobs: a bounded
queue of background work with a deadline per job and a cap per source.
"""

import collections
import threading
import time

from ._types import nixlBackendError, nixlNotAllowedError


def source_of(sender, claimed):
    """The source a listener message is charged to: the segment of te's
    proven sender ((segment, instance), with a cluster secret), else the
    identity the message claims (None: without a secret nothing is
    proven)."""
    return sender[0] if sender is not None else claimed


class Sources:
    """Agents and ranges held per source, for metadata that arrived through
    the listener (metadata the application loads itself is its own call:
    source None, not counted). Not locked: the agent calls it under its
    lock."""

    def __init__(self, max_agents, max_ranges, max_total):
        self.max_agents, self.max_ranges, self.max_total = max_agents, max_ranges, max_total
        self.held = {}  # source -> [agents, ranges]
        self.total = 0  # ranges held by every source
        self.refused = 0

    def check(self, source, old, n, name):
        """Raise nixlNotAllowedError if source holding n ranges for agent
        name, in place of old (the remote it replaces or updates, or None),
        would pass a bound."""
        if source is None:
            return
        agents, ranges = self.held.get(source, (0, 0))
        total = self.total + n
        if old is not None and old.source is not None:
            total -= old.charged
        if old is not None and old.source == source:
            ranges -= old.charged
        else:
            agents += 1
        ranges += n
        why = None
        if agents > self.max_agents:
            why = f"it announced {self.max_agents} agents already"
        elif ranges > self.max_ranges:
            why = f"its agents would hold {ranges} ranges, over {self.max_ranges}"
        elif total > self.max_total:
            why = f"metadata from the listener would hold {total} ranges in all, over {self.max_total}"
        if why:
            self.refused += 1
            raise nixlNotAllowedError(f"metadata of {name!r} from {source!r} refused: {why}")

    def charge(self, r, source, n):
        """r (a remote) now holds n ranges on behalf of source."""
        self.release(r)
        if source is None:
            return
        h = self.held.setdefault(source, [0, 0])
        h[0] += 1
        h[1] += n
        self.total += n
        r.source, r.charged = source, n

    def release(self, r):
        """r's ranges no longer count (it was dropped, or reloaded)."""
        s = r.source
        if s is None:
            return
        h = self.held[s]
        h[0] -= 1
        h[1] -= r.charged
        self.total -= r.charged
        if h[0] == 0:
            del self.held[s]
        r.source, r.charged = None, 0


class Job:
    __slots__ = ("fn", "what", "source", "key", "deadline")

    def __init__(self, fn, what, source, key, deadline):
        self.fn, self.what, self.source, self.key, self.deadline = fn, what, source, key, deadline


class Jobs:
    """A FIFO of background jobs: at most cap queued, at most per_source of
    one source (None: no per-source cap); a job whose key is queued already
    is not queued twice. Each job has a deadline (monotonic seconds): the
    runner drops a job it takes after its deadline instead of running it.
    Thread-safe."""

    def __init__(self, cap, per_source=None):
        self.cap, self.per_source = cap, per_source
        self._cv = threading.Condition()
        self._q = collections.deque()
        self._per = {}
        self._keys = set()
        self.refused = 0
        self.merged = 0
        self.expired = 0

    def __len__(self):
        with self._cv:
            return len(self._q)

    def put(self, fn, what, ttl, source=None, key=None):
        """Queue fn (called with the agent) to start within ttl seconds.
        Returns False when a job with key is queued already (this one is
        that one); raises nixlBackendError over a bound."""
        with self._cv:
            if key is not None and key in self._keys:
                self.merged += 1
                return False
            if len(self._q) >= self.cap:
                self.refused += 1
                raise nixlBackendError(f"{self.cap} background jobs queued; {what} refused")
            if source is not None and self.per_source is not None and self._per.get(source, 0) >= self.per_source:
                self.refused += 1
                raise nixlBackendError(f"{self.per_source} background jobs of {source!r} queued; {what} refused")
            self._q.append(Job(fn, what, source, key, time.monotonic() + ttl))
            if source is not None:
                self._per[source] = self._per.get(source, 0) + 1
            if key is not None:
                self._keys.add(key)
            self._cv.notify()
            return True

    def get(self, timeout):
        """The oldest job, or None after timeout seconds without one."""
        with self._cv:
            if not self._q and not self._cv.wait_for(lambda: self._q, timeout):
                return None
            j = self._q.popleft()
            if j.source is not None:
                n = self._per[j.source] - 1
                if n:
                    self._per[j.source] = n
                else:
                    del self._per[j.source]
            if j.key is not None:
                self._keys.discard(j.key)
            return j

    def expire(self, j):
        """Whether j's deadline passed (counted: the runner drops it)."""
        if time.monotonic() <= j.deadline:
            return False
        with self._cv:
            self.expired += 1
        return True
