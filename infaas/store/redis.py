"""Redis store: for several front ends sharing one store, or a cluster.

Documents of a kind live in one hash (field = key). Usage rows are hashes of integer counters
incremented with HINCRBY inside MULTI/EXEC, indexed by minute in a sorted set; HINCRBY is atomic on
the server, so concurrent front ends never lose an increment.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from infaas.errors import StoreError
from infaas.store.base import CHANGE_LOG_LENGTH, Change, ChangeKind, DocumentStore, UsageMark
from infaas.types import UsageDelta, UsageKey, UsageRecord

__all__ = ["RedisStore"]

# Deleting by prefix must be atomic; a script runs without interleaving on the server.
_DELETE_PREFIX = """
local n = 0
for _, field in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(field, 1, string.len(ARGV[1])) == ARGV[1] then
    redis.call('HDEL', KEYS[1], field)
    n = n + 1
  end
end
return n
"""


# A marked usage add: skip when the source's mark already covers the batch, else move the mark and
# add every counter, in one script (atomic on the server). KEYS[1] is the marks hash, KEYS[2] the
# minute index; ARGV: source, seq, then (member, minute, n, name1, value1, ...) per usage row.
_ADD_MARKED = """
local seen = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if seen >= tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local prefix = ARGV[3]
local i = 4
while i <= #ARGV do
  local member, minute, n = ARGV[i], ARGV[i + 1], tonumber(ARGV[i + 2])
  for j = 1, n do
    redis.call('HINCRBY', prefix .. member, ARGV[i + 1 + 2 * j], ARGV[i + 2 + 2 * j])
  end
  redis.call('ZADD', KEYS[2], minute, member)
  i = i + 3 + 2 * n
end
return 1
"""


# Take or renew a lease: KEYS[1] the lease, ARGV holder and TTL in ms; the server's clock expires it.
_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

# Append to the change log: KEYS[1] the counter, KEYS[2] the log (a sorted set scored by seq);
# ARGV the member's tail (kind and name, JSON) and the length kept.
_PUBLISH = """
local seq = redis.call('INCR', KEYS[1])
redis.call('ZADD', KEYS[2], seq, seq .. ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[2]) - 1)
return seq
"""

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisStore(DocumentStore):
    """`timeout_s` bounds every call (connect and each reply): a Redis that stops answering makes
    a call fail with `StoreError` in that time instead of hanging the caller."""

    def __init__(self, url: str, namespace: str = "infaas", timeout_s: float = 2.0) -> None:
        self.url = url
        self.ns = namespace
        self._r: redis.Redis = redis.Redis.from_url(
            url,
            decode_responses=True,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=10,
        )
        try:
            self._r.ping()
        except redis.RedisError as exc:
            raise StoreError(
                f"cannot reach Redis at {url}: {exc}; start redis-server or unset INFAAS_REDIS_URL "
                "to use the embedded SQLite store",
                url=url,
            ) from exc
        self._delete_prefix = self._r.register_script(_DELETE_PREFIX)
        self._add_marked = self._r.register_script(_ADD_MARKED)
        self._acquire = self._r.register_script(_ACQUIRE)
        self._release = self._r.register_script(_RELEASE)
        self._publish = self._r.register_script(_PUBLISH)

    def _docs_key(self, kind: str) -> str:
        return f"{self.ns}:doc:{kind}"

    def _run(self, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except redis.RedisError as exc:
            raise StoreError(f"Redis {what} failed: {exc}", url=self.url) from exc

    def put_docs(self, docs: Iterable[tuple[str, str, str]]) -> None:
        def write() -> None:
            pipe = self._r.pipeline(transaction=True)
            for kind, key, raw in docs:
                pipe.hset(self._docs_key(kind), key, raw)
            pipe.execute()

        self._run("write", write)

    def get_doc(self, kind: str, key: str) -> str | None:
        value = self._run("read", self._r.hget, self._docs_key(kind), key)
        return None if value is None else str(value)

    def list_docs(self, kind: str, prefix: str = "") -> list[str]:
        everything: dict[str, str] = self._run("read", self._r.hgetall, self._docs_key(kind))
        return [everything[k] for k in sorted(everything) if k.startswith(prefix)]

    def delete_docs(self, kind: str, prefix: str, exact: bool = False) -> None:
        if exact:
            self._run("delete", self._r.hdel, self._docs_key(kind), prefix)
        else:
            self._run("delete", lambda: self._delete_prefix(keys=[self._docs_key(kind)], args=[prefix]))

    def _usage_member(self, key: UsageKey) -> str:
        return json.dumps([key.tenant, key.task, key.variant, key.minute])

    def add_usage(self, deltas: Sequence[UsageDelta], mark: UsageMark | None = None) -> bool:
        if mark is not None:
            args: list[str | int] = [mark[0], mark[1], f"{self.ns}:usage:"]
            for delta in deltas:
                args += [self._usage_member(delta.key), delta.key.minute, len(delta.counters)]
                for name, value in delta.counters.items():
                    args += [name, value]
            keys = [f"{self.ns}:usage_marks", f"{self.ns}:usage_index"]
            return bool(self._run("usage write", lambda: self._add_marked(keys=keys, args=args)))

        def write() -> None:
            pipe = self._r.pipeline(transaction=True)
            for delta in deltas:
                member = self._usage_member(delta.key)
                for name, value in delta.counters.items():
                    pipe.hincrby(f"{self.ns}:usage:{member}", name, value)
                pipe.zadd(f"{self.ns}:usage_index", {member: delta.key.minute})
            pipe.execute()

        self._run("usage write", write)
        return True

    def usage_mark(self, source: str) -> int:
        value = self._run("read", self._r.hget, f"{self.ns}:usage_marks", source)
        return int(value) if value is not None else 0

    def usage(
        self, tenant: str | None = None, from_minute: int | None = None, to_minute: int | None = None
    ) -> list[UsageRecord]:
        def read() -> list[UsageRecord]:
            lo = "-inf" if from_minute is None else from_minute
            hi = "+inf" if to_minute is None else to_minute
            members = [str(m) for m in self._r.zrangebyscore(f"{self.ns}:usage_index", lo, hi)]
            members = [m for m in members if tenant is None or json.loads(m)[0] == tenant]
            pipe = self._r.pipeline(transaction=False)
            for m in members:
                pipe.hgetall(f"{self.ns}:usage:{m}")
            rows = []
            for m, counters in zip(members, pipe.execute(), strict=True):
                t, task, variant, minute = json.loads(m)
                key = UsageKey(tenant=t, task=task, variant=variant, minute=minute)
                rows.append(UsageRecord(key=key, counters={k: int(v) for k, v in counters.items()}))
            rows.sort(key=lambda r: (r.key.tenant, r.key.task, r.key.variant, r.key.minute))
            return rows

        result: list[UsageRecord] = self._run("usage read", read)
        return result

    def acquire_lease(self, name: str, holder: str, ttl_s: float) -> bool:
        keys = [f"{self.ns}:lease:{name}"]
        args: list[str | int] = [holder, max(1, int(ttl_s * 1000))]
        return bool(self._run("lease", lambda: self._acquire(keys=keys, args=args)))

    def release_lease(self, name: str, holder: str) -> None:
        self._run("lease", lambda: self._release(keys=[f"{self.ns}:lease:{name}"], args=[holder]))

    def publish_change(self, kind: ChangeKind, name: str) -> int:
        keys = [f"{self.ns}:changes:seq", f"{self.ns}:changes"]
        args: list[str | int] = [" " + json.dumps([kind, name]), CHANGE_LOG_LENGTH]
        return int(self._run("change write", lambda: self._publish(keys=keys, args=args)))

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        members = self._run(
            "change read", self._r.zrangebyscore, f"{self.ns}:changes", f"({seq}", "+inf", 0, limit
        )
        out = []
        for member in members:
            head, _, tail = str(member).partition(" ")
            kind, name = json.loads(tail)
            out.append(Change(int(head), kind, name))
        return out

    def change_cursor(self) -> int:
        value = self._run("read", self._r.get, f"{self.ns}:changes:seq")
        return int(value) if value is not None else 0

    def flush_namespace(self) -> None:
        """Delete every key of this namespace (tests use a namespace of their own)."""
        for key in self._r.scan_iter(f"{self.ns}:*"):
            self._r.delete(key)

    def close(self) -> None:
        self._r.close()
