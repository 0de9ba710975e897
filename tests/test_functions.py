"""The database's functions and triggers are today's definitions in jobqueue/sql/functions/, and
`sa-core migrate` brings back a definition that drifted."""

from __future__ import annotations

import psycopg

from jobqueue.schema.functions import drift, load_definitions, signature_drift, undeclared
from jobqueue.schema.migrate import migrate

DEFINITIONS = load_definitions()


def test_every_function_and_trigger_in_the_database_is_the_one_in_the_tree(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        assert [d.name for d in drift(conn, DEFINITIONS)] == []
        assert signature_drift(conn, DEFINITIONS) == []
        assert undeclared(conn, DEFINITIONS) == []
    # NOTE: the tree names every trigger the state machine and the event log rely on.
    triggers = {t for d in DEFINITIONS for t in d.triggers}
    assert {"sa_job_guard", "sa_job_events_inserted", "sa_job_events_updated", "sa_job_touch",
            "sa_entity_touch"} <= triggers


def test_no_trigger_decides_a_transition_any_more(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT proname FROM pg_proc WHERE proname IN "
                            "('sa_job_settle_dependents', 'sa_job_rearm_dependents')").fetchall()
    assert rows == []


def test_migrate_restores_a_function_edited_in_place_and_a_dropped_trigger(empty_database: str) -> None:
    migrate(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("CREATE OR REPLACE FUNCTION sa_touch_updated_at() RETURNS trigger "
                     "LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END; $$")
        conn.execute("DROP TRIGGER sa_job_events_updated ON sa_job")
        assert sorted(d.name for d in drift(conn, DEFINITIONS)) == [
            "sa_job_record_events", "sa_touch_updated_at"]
    assert migrate(empty_database) == []
    with psycopg.connect(empty_database) as conn:
        assert drift(conn, DEFINITIONS) == []


def test_an_undeclared_function_is_named(empty_database: str) -> None:
    migrate(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("CREATE FUNCTION sa_by_hand() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$")
        assert undeclared(conn, DEFINITIONS) == ["sa_by_hand"]


def test_a_function_whose_settings_drifted_is_named_and_restored(empty_database: str) -> None:
    migrate(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        conn.execute("ALTER FUNCTION sa_job_record_events() RESET enable_nestloop")
        assert [d.name for d in drift(conn, DEFINITIONS)] == ["sa_job_record_events"]
        conn.execute("ALTER FUNCTION sa_touch_updated_at() SET work_mem = '64MB'")
        assert sorted(d.name for d in drift(conn, DEFINITIONS)) == [
            "sa_job_record_events", "sa_touch_updated_at"]
    assert migrate(empty_database) == []
    with psycopg.connect(empty_database) as conn:
        assert drift(conn, DEFINITIONS) == []
        settings = conn.execute("SELECT proconfig FROM pg_proc "
                                "WHERE proname = 'sa_job_record_events'").fetchone()
    assert settings == (["enable_nestloop=off"],)


def test_a_function_whose_arguments_or_result_type_drifted_is_named(empty_database: str) -> None:
    migrate(empty_database)
    with psycopg.connect(empty_database, autocommit=True) as conn:
        # NOTE: another argument list is an overload beside the declared function.
        conn.execute("CREATE FUNCTION sa_job_measured(since timestamptz, until timestamptz) "
                     "RETURNS TABLE (org_id bigint) LANGUAGE sql AS $$ SELECT 1::bigint $$")
        assert signature_drift(conn, DEFINITIONS) == ["sa_job_measured"]
        conn.execute("DROP FUNCTION sa_job_measured(timestamptz, timestamptz)")
        assert signature_drift(conn, DEFINITIONS) == []
        # NOTE: the same arguments with another result type (a CREATE OR REPLACE cannot do it).
        conn.execute("DROP FUNCTION sa_touch_updated_at() CASCADE")
        conn.execute("CREATE FUNCTION sa_touch_updated_at() RETURNS boolean LANGUAGE sql "
                     "AS $$ SELECT true $$")
        assert signature_drift(conn, DEFINITIONS) == ["sa_touch_updated_at"]
