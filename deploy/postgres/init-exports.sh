#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialized (docker-entrypoint-initdb.d): the exports
# database, the application's login and Temporal's login. The five exports_* roles are created here so
# the login can be granted them now; `python starter.py migrate` finds them and grants their privileges.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v app_password="$EXPORTS_APP_PASSWORD" -v temporal_password="$TEMPORAL_DB_PASSWORD" <<'SQL'
CREATE DATABASE exports;
CREATE ROLE exports_api NOLOGIN;
CREATE ROLE exports_worker NOLOGIN;
CREATE ROLE exports_recovery NOLOGIN;
CREATE ROLE exports_dispatcher NOLOGIN;
CREATE ROLE exports_reconciler NOLOGIN;
-- NOINHERIT: the login alone can do nothing; each process SET ROLEs to the one its job needs.
CREATE ROLE exports_app LOGIN NOINHERIT PASSWORD :'app_password';
GRANT exports_api, exports_worker, exports_recovery, exports_dispatcher, exports_reconciler TO exports_app;
CREATE ROLE temporal LOGIN CREATEDB PASSWORD :'temporal_password';
SQL
