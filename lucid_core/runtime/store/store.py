"""The state store: one SQLAlchemy engine, migrated to the packaged Alembic head on open.

SQLite under LUCID_HOME by default (one file, WAL journal); PostgreSQL by URL for production.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from lucid_core.runtime.store.db_clock import database_clock, database_now, database_time
from lucid_core.runtime.store.fencing import install_fence
from lucid_core.runtime.store.location import default_store_url
from lucid_core.runtime.store.schema import ModelVersionRow, SchedulerStateRow
from lucid_core.runtime.store.schema_head import MIGRATIONS_DIR, packaged_head

if TYPE_CHECKING:  # Alembic is imported only to migrate: a store already at the head opens without it
    from alembic.config import Config

def with_installed_driver(url: str) -> str:
    """A bare `postgresql://` URL names no driver, and SQLAlchemy then assumes psycopg 3; the project installs
    psycopg2, so a bare URL uses whichever of the two is installed (an explicit `+driver` is kept)."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    rest = url.split("://", 1)[1]
    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}://{rest}"
    return url


def _alembic_config(connection: sa.Connection) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    return cfg


def stored_json(text: str | bytes) -> Any:
    """A JSON column's stored text as its value; None when it is not JSON. SQLite keeps any text a hand edit puts
    in a JSON column, and one unparseable run's GPU indices failed every round, page and API answer that read the
    row; None is a value every reader already treats as unusable (a run with no GPUs known freezes its job)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _on_sqlite_connect(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


class Store:
    """Engine + session factory of one store; `open` migrates it to the newest schema."""

    fence: Any = None  # the lease whose generation guards this view's writes (see `fenced`)

    def __init__(self, url: str, *, migrate: bool = True, echo: bool = False, pooled: bool = True) -> None:
        """`pooled=False`: no connection is kept between sessions (each opens its own and closes it), for a
        client that reads now and then among many others of its kind (a triggerer's hundreds of job waits)."""
        url = with_installed_driver(url)
        self.url = url
        if url.startswith("sqlite:///") and not url.startswith("sqlite:///:memory:"):
            Path(url.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict[str, Any] = {"echo": echo, "future": True, "json_deserializer": stored_json}
        if not pooled:
            kwargs["poolclass"] = sa.pool.NullPool
        elif url.startswith("postgresql"):
            kwargs["pool_pre_ping"] = True
        self.engine = sa.create_engine(url, **kwargs)
        if self.engine.dialect.name == "sqlite":
            sa.event.listen(self.engine, "connect", _on_sqlite_connect)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        if migrate:
            self.migrate()

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def migrate(self) -> None:
        """Upgrade the schema to the packaged head (no-op when already there; that is checked without Alembic)."""
        head = packaged_head()
        if head is not None and self._stamped() == [head]:
            return
        from alembic import command
        from alembic.runtime.migration import MigrationContext
        from alembic.script import ScriptDirectory

        with self.engine.begin() as conn:
            current = MigrationContext.configure(conn).get_current_revision()
            cfg = _alembic_config(conn)
            if current != ScriptDirectory.from_config(cfg).get_current_head():
                command.upgrade(cfg, "head")

    def _stamped(self) -> list[str]:
        """The revisions the store's alembic_version table holds (none when it has no such table)."""
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table("alembic_version"):
                return []
            return [row[0] for row in conn.execute(sa.text("SELECT version_num FROM alembic_version"))]

    def revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A session committed on success and rolled back on error."""
        session = self._sessions()
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    # --- scheduler state (a small key-value table) ------------------------------------------
    def get_state(self, key: str, default: Any = None) -> Any:
        with self.session() as s:
            row = s.get(SchedulerStateRow, key)
            return default if row is None else row.value

    def set_state(self, key: str, value: Any) -> None:
        with self.session() as s:
            row = s.get(SchedulerStateRow, key)
            if row is None:
                s.add(SchedulerStateRow(key=key, value=value))
            else:
                row.value = value

    def now(self) -> float:
        """The database's current time: what every submitter, controller and page of this store goes by."""
        return database_time(self.engine)

    def clock(self) -> Callable[[], float]:
        """A clock on the database's time, its offset from this machine's measured now (`db_clock`)."""
        return database_clock(self.engine)

    def fenced(self, lease: Any, clock: Callable[[], float] | None = None) -> Store:
        """This store seen by a lease holder: the first write of every transaction renews `lease` inside
        that transaction (by the database's clock; `clock` steps time by hand in tests), and raises
        `lease.Fenced` (writing nothing) when another take replaced it."""
        view = copy.copy(self)
        view._sessions = sessionmaker(self.engine, expire_on_commit=False)
        view.fence = lease
        view.unfenced = getattr(self, "unfenced", self)
        install_fence(view._sessions, lease, clock, view.unfenced)
        return view

    def dispose(self) -> None:
        self.engine.dispose()


def record_promotion(session: Session, kind: str, version: str, path: str, metrics: dict[str, Any], note: str,
                     created_at: float | None = None) -> None:
    """Make a promoted model version the one active `model_versions` row of its kind (what the live round
    loads; the kind's older rows stay, inactive, as its history). Written in the caller's session, so the
    Update Engine's promotions of one run commit together or not at all. Dated by the database's clock unless
    given: the round compares it with job end times (which jobs the model has not learned yet)."""
    if created_at is None:
        created_at = float(session.scalar(sa.select(database_now(session.get_bind().dialect.name))))
    session.execute(sa.update(ModelVersionRow).where(ModelVersionRow.kind == kind).values(active=False))
    session.add(ModelVersionRow(kind=kind, version=version, path=path, created_at=created_at, metrics=metrics,
                                active=True, note=note))
    session.flush()  # inserted now, in promotion order, not at the commit


def open_store(url: str | None = None) -> Store:
    """Open (and migrate) the store at `url`, or the default one."""
    return Store(url or default_store_url())
