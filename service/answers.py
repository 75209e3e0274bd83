"""The service's plan answers: each computed once, kept by request key in memory and in the ``service_plans`` table
(written before the answer is sent, so a restarted service answers it again without a search), and found again by
the raw request while the profile it was priced with is unchanged.

The table lives in the store's database, under the same alembic history (profiles/migrations/), but belongs to this
object: the profile ``Store`` neither reads nor writes it.
"""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone
from functools import partial
from typing import Any, Awaitable, Callable

import sqlalchemy as sa

from sp_plan.planner.errors import NotFound
from sp_plan.profiles.store import Database, storable
from sp_plan.service.cache import LRU, Coalescer

service_plans_t = sa.Table(
    "service_plans", sa.MetaData(),
    sa.Column("id", sa.String(64), primary_key=True),
    sa.Column("profile", sa.String(64)),
    sa.Column("created_at", sa.String(40), nullable=False),
    sa.Column("document", sa.JSON, nullable=False),
)

#: how a blocking database call runs off the event loop (the service passes its own, which counts store errors)
Offload = Callable[..., Awaitable[Any]]
#: a search: () -> (the answer's document {"response", "request"}, the id of the profile it was priced with)
Compute = Callable[[], Awaitable[tuple[dict, "str | None"]]]


def encoded(response: dict) -> tuple[bytes, bytes]:
    """A plan answer as sent: (without families, with them), encoded once and served as bytes on every hit."""
    return json.dumps({**response, "families": []}).encode(), json.dumps(response).encode()


class Answers:
    """Plan answers by request key (resolved inputs and profile version) and by raw request.

    ``get(key, compute)`` answers from memory, joins the identical computation in flight, reads the table, or
    computes and stores. ``remembered``/``remember`` skip even the cluster build for a raw request seen before with
    the same profile stamp. ``requests`` joins identical raw requests in flight (nothing kept)."""

    def __init__(self, db: Database, size: int = 1024, offload: Offload | None = None):
        self.db = db
        self.offload: Offload = offload or asyncio.to_thread
        self.by_key = Coalescer(size)  # request key -> (body without families, body with them)
        self.fingerprints = LRU(size)  # raw request hash -> the cluster's topology fingerprint
        self.bodies = LRU(size)  # (raw request hash, profile stamp) -> the body sent
        self.requests = Coalescer(0)  # raw request hash -> the identical request in flight

    # ---- the table
    def stored(self, id: str) -> dict | None:
        """The stored document ({"response", "request"}) with this id, or None."""
        if not storable(id, service_plans_t.c.id):  # no such id can be stored; the database would fail on it
            return None
        q = sa.select(service_plans_t.c.document).where(service_plans_t.c.id == id)
        with self.db.reading() as conn:
            return conn.execute(q).scalar()

    def document(self, id: str) -> dict:
        """The stored document with this id; NotFound if the service never computed it."""
        doc = self.stored(id)
        if doc is None:
            raise NotFound("id", f"no plan {id!r}", "use the id a POST /v1/plan answered")
        return doc

    def save(self, id: str, document: dict, profile: str | None = None) -> None:
        """Store (or replace, same id) an answer's document in one transaction."""
        row = {"id": id, "profile": profile, "created_at": datetime.now(timezone.utc).isoformat(timespec="microseconds"),
               "document": document}
        with self.db.transaction() as conn:
            conn.execute(service_plans_t.delete().where(service_plans_t.c.id == id))
            conn.execute(service_plans_t.insert().values(**row))

    # ---- by request key
    async def get(self, key: str, compute: Compute) -> tuple[tuple[bytes, bytes], str]:
        """(both encodings, how): how is 'memory', 'coalesced', 'store' (computed before) or 'computed'."""
        return await self.by_key.get(key, partial(self._load_or_compute, key, compute))

    async def _load_or_compute(self, key: str, compute: Compute) -> tuple[tuple[bytes, bytes], str]:
        """The stored answer, else ``compute``'s, stored before it is returned (acknowledged only once stored)."""
        doc = await self.offload(self.stored, key)
        if doc is not None:
            return encoded(doc["response"]), "store"
        doc, profile = await compute()
        await self.offload(self.save, key, doc, profile)
        return encoded(doc["response"]), "computed"

    # ---- by raw request
    def fingerprint(self, raw: str) -> str | None:
        """The topology fingerprint of the cluster of a raw request answered before, or None."""
        return self.fingerprints.get(raw)

    def remembered(self, raw: str, stamp: str | None) -> bytes | None:
        """The body sent for this raw request when its profile had this stamp, or None."""
        return self.bodies.get((raw, stamp))

    def remember(self, raw: str, fingerprint: str, stamp: str | None, body: bytes) -> None:
        """Keep a body sent, found again by its raw request and profile stamp."""
        self.fingerprints.put(raw, fingerprint)
        self.bodies.put((raw, stamp), body)
