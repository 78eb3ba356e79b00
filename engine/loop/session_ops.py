"""The engine's sessions (event loop side): create, look up, list, delete and fork,
and the engine thread's commands that release or copy a session's slot.

A mixin of `Engine` (engine/engine.py), which owns the state named below.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from engine.commands import EngineThread, Fork, ReleaseSession
from engine.llama import Model
from engine.loop.sessions import Session, SessionRegistry
from engine.types import EngineNotReadyError, NoSlotError, SessionBusyError

log = logging.getLogger("kvserve.engine")

_ALIVE_CHECK_S = 1.0  # how often a wait for the engine thread's answer checks it lives


class SessionOps:
    sessions: SessionRegistry
    _worker: EngineThread | None
    _thread: threading.Thread | None

    if TYPE_CHECKING:  # defined by Engine

        def _require_model(self) -> Model: ...

    def _expire_sessions(self) -> None:
        for session in self.sessions.expired():
            self._command(ReleaseSession(session.key))

    def _retire_session(self, session: Session) -> None:
        """A bound retired this idle session to make room: its slot goes back (its KV
        to the cache first), so a later request with its prefix starts warm."""
        log.info("session %s of a key at its bound retired (idle since %.0f s)",
                 session.id, self.sessions.idle_seconds(session))  # fmt: skip
        self._command(ReleaseSession(session.key))

    def _command(self, command: ReleaseSession | Fork) -> None:
        if self._worker is not None:
            self._worker.commands.put(command)

    def create_session(
        self, tenant: str, session_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        self._expire_sessions()
        return self.sessions.create(tenant, session_id, ttl_s)

    def get_session(self, tenant: str, session_id: str) -> Session:
        self._expire_sessions()
        return self.sessions.get(tenant, session_id)

    def list_sessions(self, tenant: str) -> list[Session]:
        self._expire_sessions()
        return self.sessions.owned_by(tenant)

    def all_sessions(self) -> list[Session]:
        """Every tenant's sessions (the admin's status view)."""
        self._expire_sessions()
        return self.sessions.all()

    def delete_session(self, tenant: str, session_id: str) -> Session:
        """End a session: its slot goes back to everyone (its KV stays reusable by
        requests with the same salt, and in the cache). A session with a request in
        flight answers SessionBusyError (409): its end would outlive the id."""
        session = self.get_session(tenant, session_id)
        if session.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        self.sessions.remove(session)
        self._command(ReleaseSession(session.key))
        return session

    def session_slot(self, key: str | None) -> int | None:
        """The slot the session (`Session.key`) pins, if any, as the engine thread last
        published it (Worker.pinned_sessions): a step old at most, which is all a report
        and the choice to skip a cache lookup need."""
        if key is None or self._worker is None:
            return None
        return self._worker.pinned_sessions.get(key)

    async def fork_session(
        self, tenant: str, session_id: str, new_id: str | None = None, ttl_s: float | None = None
    ) -> Session:
        """A new session whose KV is a copy of `session_id`'s (which must be idle).

        Raises SessionNotFoundError (404), SessionBusyError (409), NoSlotError (429),
        EngineNotReadyError (503: with no engine thread, nothing would do the copy)."""
        self._require_model()
        source = self.get_session(tenant, session_id)
        if source.in_flight:
            raise SessionBusyError(f"session '{session_id}' has a request in flight")
        target = self.sessions.create(
            tenant, new_id, source.ttl_s if ttl_s is None else ttl_s, spare=source
        )
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int, str | None]] = loop.create_future()

        def on_done(num_tokens: int, error: str | None) -> None:  # engine thread
            loop.call_soon_threadsafe(_settle, num_tokens, error)

        def _settle(num_tokens: int, error: str | None) -> None:
            if not done.done():
                done.set_result((num_tokens, error))

        target.in_flight = True  # nobody may use it before its KV is in place
        self._command(Fork(source.key, target.key, on_done))
        try:
            num_tokens, error = await self._answer_of(done)
        except asyncio.CancelledError:
            # The caller left: the fork still runs on the engine thread (commands run in
            # order), so release the new session's slot after it, and forget the session.
            self.sessions.remove(target)
            self._command(ReleaseSession(target.key))
            raise
        except EngineNotReadyError:
            self.sessions.remove(target)  # nothing was copied: no slot to release
            raise
        finally:
            target.in_flight = False
        if error is not None:
            self.sessions.remove(target)
            raise NoSlotError(f"cannot fork: {error}")
        target.num_tokens = num_tokens
        return target

    async def _answer_of(
        self, done: asyncio.Future[tuple[int, str | None]]
    ) -> tuple[int, str | None]:
        """The engine thread's answer to a command, for as long as a thread lives to
        give it: one that stopped (an unload, a close) before taking the command never
        answers, and the request waited for ever. EngineNotReadyError (503) then."""
        while True:
            try:
                return await asyncio.wait_for(asyncio.shield(done), _ALIVE_CHECK_S)
            except TimeoutError:
                thread = self._thread
                if thread is not None and thread.is_alive():
                    continue
            await asyncio.sleep(0)  # an answer it sent as it ended is delivered first
            if done.done():
                return done.result()
            raise EngineNotReadyError("the engine stopped before it answered; retry")
