#!/bin/sh
# Runs once, when the PostgreSQL volume is first initialized (docker-entrypoint-initdb.d): the exports
# database, the application's login, the platform operators' login and Temporal's login. The six exports_*
# roles are created here so the logins can be granted them now; `python starter.py migrate` finds them and
# grants their privileges.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -v app_password="$EXPORTS_APP_PASSWORD" -v temporal_password="$TEMPORAL_DB_PASSWORD" <<'SQL'
CREATE DATABASE exports;
CREATE ROLE exports_api NOLOGIN;
CREATE ROLE exports_worker NOLOGIN;
CREATE ROLE exports_recovery NOLOGIN;
CREATE ROLE exports_dispatcher NOLOGIN;
CREATE ROLE exports_reconciler NOLOGIN;
CREATE ROLE exports_platform NOLOGIN;
-- NOINHERIT: the login alone can do nothing; each process SET ROLEs to the one its job needs. The
-- application's login is not granted exports_platform: the API and the workers never change the global
-- delivery switch (migration 0019 refuses it to exports_api).
CREATE ROLE exports_app LOGIN NOINHERIT PASSWORD :'app_password';
GRANT exports_api, exports_worker, exports_recovery, exports_dispatcher, exports_reconciler TO exports_app;
-- The platform's operators run `starter.py pause --global` / `resume --global` as their own login:
-- exports_platform changes the global switch, exports_api counts and wakes the exports it holds.
CREATE ROLE exports_platform_ops LOGIN NOINHERIT;
GRANT exports_api, exports_platform TO exports_platform_ops;
CREATE ROLE temporal LOGIN CREATEDB PASSWORD :'temporal_password';
SQL
# Without EXPORTS_PLATFORM_PASSWORD the platform's login has no password and cannot log in until an
# administrator gives it one (ALTER ROLE exports_platform_ops PASSWORD ...).
if [ -n "${EXPORTS_PLATFORM_PASSWORD:-}" ]; then
    psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
        -v platform_password="$EXPORTS_PLATFORM_PASSWORD" <<'SQL'
ALTER ROLE exports_platform_ops PASSWORD :'platform_password';
SQL
fi
