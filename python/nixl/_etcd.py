"""Agent metadata through etcd, as NIXL exchanges it when NIXL_ETCD_ENDPOINTS
is set (the way Dynamo deployments run it): send_local_metadata,
send_partial_agent_metadata, fetch_remote_metadata and
invalidate_local_metadata called without a peer address go to etcd.

What carries over from NIXL (its etcd metadata backend):
  - NIXL_ETCD_ENDPOINTS selects etcd (a comma-separated list of
    http://host:port); NIXL_ETCD_NAMESPACE is the key prefix, by default
    "/nixl/agents/".
  - An agent's keys are <namespace>/<agent>/<label>, the namespace used as
    given (so the default yields "/nixl/agents//<agent>/<label>"). Full
    metadata has the label "metadata"; partial metadata needs a label of
    the caller's. Before its first publish the agent writes its prefix key
    <namespace>/<agent>/ with an empty value; an empty value is never
    metadata.
  - A fetch reads <namespace>/<agent>/<label> (label "metadata" by
    default); a key not there yet is waited for, up to 5 s, NIXL's default
    watch timeout. It runs in the background: check_remote_metadata turns
    True once the metadata is loaded.
  - Invalidation removes the agent's keys. An agent that loaded a peer's
    metadata from etcd watches the peer's prefix, and drops the peer's
    metadata when its keys are deleted (check_remote_metadata turns False).

What te does its own way: etcd is reached through libte's etcd client
(te.Store), so TLS (https:// endpoints, TE_ETCD_CACERT/_CERT/_KEY) and
etcd's users (TE_ETCD_USER/_PASSWORD) work as for te's own segments. Keys
live under the store's lease: closing the agent removes them, and an agent
that dies without closing loses them one lease TTL (10 s) later, where
NIXL's keys outlive it. Sends and invalidation report a store that cannot
be reached to the caller (after te's store timeout, 5 s) instead of only
logging it; a failed put is still made once etcd answers again. Invalidation
removes the keys this agent put, not every key under its prefix.
"""

import os
import threading
import time
from urllib.parse import urlsplit

import te

from ._types import nixlBackendError, nixlInvalidParamError, nixlNotFoundError

ENV_ENDPOINTS = "NIXL_ETCD_ENDPOINTS"
DEFAULT_NAMESPACE = "/nixl/agents/"
DEFAULT_LABEL = "metadata"
WATCH_TIMEOUT_S = 5.0
POLL_S = 0.02


def configured():
    return bool(os.environ.get("NIXL_ETCD_ENDPOINTS", "").strip())


def conn_string(endpoints):
    """te's connection string for a NIXL_ETCD_ENDPOINTS list: etcd://h1:p1,h2:p2
    (etcds:// when the endpoints are https://)."""
    hosts, schemes = [], set()
    for ep in endpoints.split(","):
        ep = ep.strip()
        if not ep:
            continue
        if "://" not in ep:
            ep = "http://" + ep
        u = urlsplit(ep)
        if u.scheme not in ("http", "https") or not u.netloc or u.path not in ("", "/") or u.query:
            raise nixlInvalidParamError(f"{ENV_ENDPOINTS}: {ep!r} is not http://host:port or https://host:port")
        schemes.add(u.scheme)
        hosts.append(u.netloc)
    if not hosts:
        raise nixlInvalidParamError(f"{ENV_ENDPOINTS} lists no endpoint")
    if len(schemes) > 1:
        raise nixlInvalidParamError(f"{ENV_ENDPOINTS} mixes http:// and https:// endpoints")
    return ("etcds" if "https" in schemes else "etcd") + "://" + ",".join(hosts)


class EtcdMD:
    """One agent's view of etcd. Thread-safe."""

    def __init__(self, agent):
        self.agent = agent
        self.namespace = os.environ.get("NIXL_ETCD_NAMESPACE") or DEFAULT_NAMESPACE
        self.endpoints = os.environ.get("NIXL_ETCD_ENDPOINTS", "")
        try:
            self.store = te.Store(conn_string(self.endpoints))
        except te.TeError as e:
            raise nixlInvalidParamError(f"{ENV_ENDPOINTS}={self.endpoints!r}: {e}") from e
        self._lock = threading.Lock()
        self._put = set()  # labels this agent published ("" is the prefix key)
        self._watched = {}  # agent -> the label its metadata was fetched from
        self._loaded = set()  # watched agents whose metadata was loaded: only they can leave

    def key(self, agent, label):
        return f"{self.namespace}/{agent}/{label}"

    def _fail(self, what, e):
        return nixlBackendError(f"etcd at {self.endpoints}: {what}: {e}")

    def publish(self, label, blob):
        with self._lock:
            try:
                if "" not in self._put:
                    self.store.put(self.key(self.agent, ""), b"")
                    self._put.add("")
                self.store.put(self.key(self.agent, label), blob)
            except te.TeError as e:
                raise self._fail(f"publishing {self.key(self.agent, label)}", e) from e
            self._put.add(label)

    def fetch(self, agent, label, stop):
        """The metadata at agent's key; waits up to WATCH_TIMEOUT_S for it to
        appear. Raises nixlNotFoundError when it does not."""
        key = self.key(agent, label)
        deadline = time.monotonic() + WATCH_TIMEOUT_S
        while True:
            try:
                v = self.store.get(key)
                if v:  # empty: the prefix key, or a key mid-write
                    return v
            except te.NotFound:
                pass
            except te.TeError as e:
                raise self._fail(f"reading {key}", e) from e
            if time.monotonic() >= deadline or stop.is_set():
                raise nixlNotFoundError(f"no metadata at {key} in etcd at {self.endpoints} "
                                  f"after {WATCH_TIMEOUT_S:g} s")
            time.sleep(POLL_S)

    def watch(self, agent, label):
        """Watch agent's keys (after its metadata was loaded from label)."""
        with self._lock:
            self._watched[agent] = label
        try:
            self.store.watch(self.key(agent, ""))
        except te.TeError as e:
            with self._lock:
                self._watched.pop(agent, None)
            raise self._fail(f"watching {self.key(agent, '')}", e) from e

    def unwatch(self, agent, label):
        """Stop watching agent, if it is still watched for label."""
        with self._lock:
            if self._watched.get(agent) != label:
                return
            del self._watched[agent]
            self._loaded.discard(agent)
        try:
            self.store.unwatch(self.key(agent, ""))
        except te.TeError:
            pass

    def loaded(self, agent, label):
        """Record that agent's metadata (from label) is loaded, and report
        whether its key is still in etcd. Changes before this call do not
        count as leaving (the peer was still publishing); a deletion
        between the read that loaded it and this call is what the answer
        catches; any later one, the watcher does."""
        with self._lock:
            if self._watched.get(agent) != label:
                return True
            self._loaded.add(agent)
        try:
            return bool(self.store.get(self.key(agent, label)))
        except te.NotFound:
            return False
        except te.TeError:
            return True  # etcd away: the watch reports the prefix when it answers

    def watching(self):
        with self._lock:
            return bool(self._watched)

    def gone(self):
        """The watched agents whose metadata key was deleted since the last
        call (they are watched no more). A change is checked with a read:
        a put (a republish) keeps the agent."""
        keys = self.store.changes()
        if not keys:
            return []
        root = self.namespace + "/"
        with self._lock:
            watched = {n: l for n, l in self._watched.items() if n in self._loaded}
        hit = set()
        for k in keys:
            name = k[len(root):].rsplit("/", 1)[0] if k.startswith(root) else None
            if name in watched:
                hit.add(name)
            else:  # a label or name with "/" in it, or a prefix reported whole
                hit.update(n for n in watched if k.startswith(self.key(n, "")) or self.key(n, "").startswith(k))
        out = []
        for name in sorted(hit):
            try:
                if self.store.get(self.key(name, watched[name])):
                    continue
            except te.NotFound:
                pass
            except te.TeError:
                continue  # etcd away: decided when it answers (the watch reports the prefix then)
            with self._lock:
                if self._watched.get(name) == watched[name]:
                    del self._watched[name]
                    self._loaded.discard(name)
            try:
                self.store.unwatch(self.key(name, ""))
            except te.TeError:
                pass
            out.append(name)
        return out

    def invalidate(self):
        with self._lock:
            for label in sorted(self._put, key=lambda s: s == ""):  # the prefix key last
                key = self.key(self.agent, label)
                try:
                    self.store.delete(key)
                except te.TeError as e:
                    raise self._fail(f"removing {key}", e) from e
                self._put.discard(label)

    def close(self):
        self.store.close()
