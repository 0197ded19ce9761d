"""Declarative base with a naming convention, engine construction and id generation."""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, Engine, MetaData, create_engine, event
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import DeclarativeBase, ORMExecuteState, Session, SessionTransaction, sessionmaker
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite stores them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_id() -> str:
    """A ULID: 48-bit millisecond timestamp + 80 random bits, Crockford base32, 26 characters.

    Ids sort by creation time, which keyset pagination relies on."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


# The pool of a database file or server, per process (SQLAlchemy's QueuePool defaults, named): up to
# POOL_SIZE connections stay open, the rest of its capacity (PLANNER_DATABASE_POOL_CONNECTIONS) is opened
# under load. The ConnectionGate admits as many requests at once as there are connections, so the pool
# itself never makes a request wait.
POOL_SIZE = 5
POOL_MAX_OVERFLOW = 10
POOL_CAPACITY = POOL_SIZE + POOL_MAX_OVERFLOW


def make_engine(
    url: str,
    *,
    sqlite_busy_timeout_ms: int = 5_000,
    connect_timeout_s: int = 5,
    statement_timeout_ms: int = 30_000,
    pool_timeout_s: float = 10.0,
    pool_connections: int = POOL_CAPACITY,
) -> Engine:
    """Engine for SQLite (WAL, busy timeout, foreign keys on) or PostgreSQL via psycopg 3 with a
    connect timeout, a statement timeout and a pool wait: a database that accepts TCP but never
    answers, a stuck statement or an exhausted pool ends as a 503, never a hung request.
    ``pool_connections``: the most connections this process opens (PostgreSQL's max_connections is
    shared by every worker of every replica)."""
    size = min(POOL_SIZE, pool_connections)
    pool = {"pool_size": size, "max_overflow": pool_connections - size, "pool_timeout": pool_timeout_s}
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": sqlite_busy_timeout_ms / 1000},
            **({} if ":memory:" in url else pool),  # one connection per thread in memory, no pool
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            if ":memory:" not in url:
                cursor.execute("PRAGMA journal_mode=WAL")
                cursor.execute("PRAGMA synchronous=FULL")  # each commit's WAL is on disk before its 2xx
            cursor.execute(f"PRAGMA busy_timeout={int(sqlite_busy_timeout_ms)}")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        connect_args={
            "connect_timeout": connect_timeout_s,  # psycopg: per address of the host, at least 2 s
            "options": f"-c statement_timeout={int(statement_timeout_ms)}",
        },
        **pool,
    )


class ConnectionWaitTimeout(PoolTimeout):
    """No database connection came free before the request's deadline (a 503, as the pool's own
    timeout is)."""


class ConnectionGate:
    """At most ``capacity`` requests (the pool's connections) use the database at once; the others wait
    in line, each until its own deadline, counted from its arrival.

    SQLAlchemy's pool wait does not hold a request's total: it starts when the request's thread
    asks (after it queued for a worker thread behind the hung ones), and a waiter woken by a failed
    connection attempt starts a connection attempt of its own. Against a database that accepts TCP
    and never answers, 60 concurrent requests took up to 25 s with a 5 s connect and a 10 s pool
    timeout. Behind the gate a request holds a slot for as long as its session is open and the pool
    always has a connection (or room for one) for it: its wait for the database is the gate's, up to
    its deadline, then at most one connection attempt."""

    def __init__(self, capacity: int = POOL_CAPACITY) -> None:
        self._slots = threading.BoundedSemaphore(capacity)

    @contextlib.contextmanager
    def slot(self, deadline_s: float) -> Iterator[None]:
        """Hold a slot while the block runs; ConnectionWaitTimeout when none is free by
        `deadline_s` (time.monotonic()), at once when that has passed."""
        remaining_s = deadline_s - time.monotonic()
        if remaining_s <= 0 or not self._slots.acquire(timeout=remaining_s):
            raise ConnectionWaitTimeout("no database connection came free before the request's deadline")
        try:
            yield
        finally:
            self._slots.release()


def sqlite_file_identity(engine: Engine) -> tuple[str, int, int] | None:
    """(path, device, inode) of a SQLite database file, or None (PostgreSQL, in-memory, not yet
    created). A file deleted or replaced under a running service changes it: writes would go to an
    unlinked inode and be lost while every request still succeeded."""
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        return None
    try:
        stat = os.stat(database)
    except FileNotFoundError:
        return (database, -1, -1)
    return (database, stat.st_dev, stat.st_ino)


# A read a write follows (``ClusterRepository.get_for_write``) carries this execution option: on SQLite,
# whose SELECT ... FOR UPDATE is a plain SELECT, it takes the writer before the read.
WRITER_OPTION = "trainplan_take_writer"


class WriterBusy(SQLAlchemyError):
    """The process's SQLite writer slot stayed taken for the whole busy timeout (a 503, as SQLite's
    own "database is locked" is)."""


def serialize_sqlite_writes(
    factory: sessionmaker[Session], timeout_s: float, database_path: str | None = None
) -> Callable[[], None]:
    """One writing transaction at a time for a SQLite database, queued on a lock: across this
    process's threads, and across the processes serving the same file.

    SQLite has one writer; a second one's INSERT waits in SQLite's busy handler, which sleeps in
    growing steps (up to 100 ms) and polls, so under a burst of writes the waits, not the work, make
    the tail latency (seconds at 8 concurrent plans in one process; with two processes on one file
    the plans' p99 was 0.8-1.0 s against 0.26 s for one). A session takes the lock before its first
    flush and gives it back when its transaction ends (commit, rollback or close); reads never take
    it. Between processes the lock is an advisory `flock` on `<database>-writer.lock`, waited for
    by a blocking `flock` bounded by the busy timeout (`FileLock`); where that file cannot be
    opened (a read-only folder) SQLite's own lock is all there is, and the write then fails as
    SQLite decides. Returns what closes the lock file."""
    lock = threading.Lock()
    held = "sqlite_writer_lock"
    descriptor = _open_lock_file(database_path + "-writer.lock") if database_path else None
    file_lock = FileLock(descriptor) if descriptor is not None else None

    def _take_file_lock(deadline: float) -> bool:
        return file_lock is None or file_lock.acquire(deadline - time.monotonic())

    @event.listens_for(factory, "before_flush")
    def _take(session: Session, _context: Any, _instances: Any) -> None:
        if session.info.get(held):
            return
        deadline = time.monotonic() + timeout_s
        if not lock.acquire(timeout=timeout_s):
            raise WriterBusy("another request held its one writer for the whole busy timeout")
        if not _take_file_lock(deadline):
            lock.release()
            raise WriterBusy("another service process held its one writer for the whole busy timeout")
        session.info[held] = True

    @event.listens_for(factory, "do_orm_execute")
    def _take_before_reading_for_write(state: ORMExecuteState) -> None:
        if state.execution_options.get(WRITER_OPTION):
            _take(state.session, None, None)

    @event.listens_for(factory, "after_transaction_end")
    def _give_back(session: Session, transaction: SessionTransaction) -> None:
        if transaction.parent is None and session.info.pop(held, False):
            if file_lock is not None:
                file_lock.release()
            lock.release()

    def _close() -> None:
        if file_lock is not None:
            file_lock.close()

    return _close


class FileLock:
    """An exclusive `flock` on an open file, taken within a timeout without polling.

    The first try does not block. When another process holds the lock, one helper thread (per
    lock, started on the first wait) waits in a blocking `flock` and hands the lock to the waiting
    taker; a taker that gives up at its timeout leaves the helper waiting, and whatever the helper
    then takes goes to the next taker, or is given back at once when none waits. Takers must come
    one at a time (``serialize_sqlite_writes`` holds its thread lock around them): the lock is the
    open file's, so it is held for the process, not for a thread."""

    def __init__(self, descriptor: int) -> None:
        self._fd = descriptor
        self._state = threading.Condition()
        self._helper: threading.Thread | None = None
        self._helper_waiting = False  # the helper is (or is about to be) in a blocking flock
        self._taker_waiting = False
        self._granted = False  # the helper took the lock for the waiting taker
        self._closed = False

    def acquire(self, timeout_s: float) -> bool:
        """Whether the lock was taken within ``timeout_s`` seconds (a non-blocking try when <= 0)."""
        with self._state:
            if not self._helper_waiting:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
                if timeout_s <= 0:
                    return False
                self._helper_waiting = True
                if self._helper is None:
                    self._helper = threading.Thread(target=self._wait_for_lock, daemon=True, name="flock")
                    self._helper.start()
                self._state.notify_all()
            self._taker_waiting = True
            try:
                taken = self._state.wait_for(lambda: self._granted, timeout=max(0.0, timeout_s))
            finally:
                self._taker_waiting = False
            self._granted = False
            return taken

    def release(self) -> None:
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file; a helper still waiting for the lock closes it once it has it."""
        with self._state:
            self._closed = True
            self._state.notify_all()
            if not self._helper_waiting:
                os.close(self._fd)

    def _wait_for_lock(self) -> None:
        while True:
            with self._state:
                self._state.wait_for(lambda: self._helper_waiting or self._closed)
                if not self._helper_waiting:
                    return  # closed
            fcntl.flock(self._fd, fcntl.LOCK_EX)  # blocks until the other process lets go
            with self._state:
                self._helper_waiting = False
                if self._taker_waiting and not self._closed:
                    self._granted = True
                    self._state.notify_all()
                    continue
                fcntl.flock(self._fd, fcntl.LOCK_UN)  # its taker gave up and no other waits
                if self._closed:
                    os.close(self._fd)
                    return


def _open_lock_file(path: str) -> int | None:
    """A descriptor for the cross-process writer lock, kept open for the life of the process."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return None


def driver_message(exc: BaseException) -> str:
    """The first line of the database driver's own message (connection refused, no such database,
    authentication failed, too many clients), for the log: an answer names only the error's class."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0][:300] if lines else type(orig).__name__
