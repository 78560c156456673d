-- Delivery windows per destination (issue #25, item 2): the partner's intake hours, given in the partner's
-- time zone, and its blackout dates. They are part of the destination (its recorded versions, changed by an
-- admin through edit_destination_if_version) and are enforced on the database clock, stated once here:
--
--   delivery_window_open(d, at)   whether the partner takes deliveries at the instant ``at``;
--   next_window_opening(d, at)    the first instant at or after ``at`` when it does.
--
-- The claim (claim_if_queued) claims only inside the window; outside it the export stays Queued and waits for
-- the next opening (available_at, with a wake-up deferred as long). Cutoff 2 (authorize_delivery_if_running)
-- refuses when the window closed during the build (WindowClosed): the attempt is given back uncounted, to
-- wait for the next opening. The rename fence (fence_rename_if_delivering) is written only inside the
-- window, so no rename is ever sent outside it.
--
-- Wall-clock semantics: ``at`` is read in the partner's time zone (AT TIME ZONE, an IANA name); the window
-- is open when that local date is not a blackout date and the local time of week falls in one of the intake
-- hours. Across a DST change the wall clock decides: hours 02:30-04:00 open at 03:00 on the day the clock
-- jumps from 02:00 to 03:00, and hours 02:00-02:30 are open twice on the day it falls back.
--
-- A window is not a delivery term (not in destination_delivery_terms): changing it changes neither what is
-- built nor where it goes, and cutoff 2 and the rename fence read the window as it is now, so an edit never
-- forces a rebuild.

-- -- the intake hours' syntax, stated once ---------------------------------------------------------------

-- One entry: days, then hours, as "Mon-Fri 08:00-18:00", "Sat,Sun 10:00-12:00", "Mon-Fri 22:00-06:00"
-- (overnight: it closes the next day), "Sun 00:00-24:00". Days are Mon..Sun, single or ranges (Fri-Mon
-- wraps), separated by commas; times are HH:MM on the minute, 24:00 only as a closing time; an entry that
-- opens and closes at the same time is refused (empty, or a whole day: write 00:00-24:00).
-- Answers the entry's ranges in minutes of the week from Monday 00:00: ``opens`` in [0, 10080), ``closes``
-- after it (past 10080 when a Sunday range runs into Monday). Raises invalid_parameter_value on anything else.
CREATE FUNCTION intake_ranges(hours text[]) RETURNS TABLE (opens int, closes int)
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    day_names constant text[] := ARRAY['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'];
    entry text;
    m text[];
    part text;
    first_day int;
    last_day int;
    day int;
    open_minute int;
    close_minute int;
BEGIN
    FOREACH entry IN ARRAY hours LOOP
        m := regexp_match(entry,
            '^((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun))?'
            '(?:,(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun))?)*)'
            ' ([01][0-9]|2[0-3]):([0-5][0-9])-(?:([01][0-9]|2[0-3]):([0-5][0-9])|(24):(00))$');
        IF m IS NULL THEN
            RAISE EXCEPTION 'intake hours: % is not like ''Mon-Fri 08:00-18:00''', quote_literal(left(entry, 60))
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        open_minute := m[2]::int * 60 + m[3]::int;
        close_minute := coalesce(m[4], m[6])::int * 60 + coalesce(m[5], m[7])::int;
        IF close_minute = open_minute THEN
            RAISE EXCEPTION 'intake hours: % opens and closes at the same time', quote_literal(entry)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF close_minute < open_minute THEN
            close_minute := close_minute + 1440;  -- overnight: closes the next day
        END IF;
        FOREACH part IN ARRAY string_to_array(m[1], ',') LOOP
            first_day := array_position(day_names, split_part(part, '-', 1)) - 1;
            last_day := coalesce(array_position(day_names, nullif(split_part(part, '-', 2), '')) - 1, first_day);
            day := first_day;
            LOOP
                opens := day * 1440 + open_minute;
                closes := day * 1440 + close_minute;
                RETURN NEXT;
                EXIT WHEN day = last_day;
                day := (day + 1) % 7;
            END LOOP;
        END LOOP;
    END LOOP;
END $$;

-- The week's intake hours as one set of minutes of the week, [0, 10080) (a Sunday range that runs into Monday
-- is split at the week's end); null for malformed hours (1 to 50 entries), which the column's check refuses.
-- Stored on the row (intake_week, generated), so the check on every claim, cutoff 2 and rename fence is one
-- containment test, not a parse.
CREATE FUNCTION intake_week_of(hours text[]) RETURNS int4multirange
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF hours IS NULL OR cardinality(hours) NOT BETWEEN 1 AND 50 OR array_position(hours, NULL) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT range_agg(w)
            FROM intake_ranges(hours) r,
                 LATERAL unnest(ARRAY[int4range(r.opens, least(r.closes, 10080)),
                                      int4range(0, greatest(r.closes - 10080, 0))]) AS w
            WHERE NOT isempty(w));
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN NULL;
END $$;

-- An IANA time zone name PostgreSQL knows ('Europe/Berlin', 'UTC'), not an abbreviation or a POSIX offset
-- string, which AT TIME ZONE would also take.
CREATE FUNCTION intake_time_zone_ok(tz text) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT tz IS NOT NULL AND tz ~ '^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$'
           AND EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz)
$$;

ALTER TABLE destinations
    -- the partner's time zone, in which its intake hours and blackout dates are read
    ADD COLUMN intake_time_zone text NOT NULL DEFAULT 'UTC',
    -- when the partner takes deliveries, each entry like 'Mon-Fri 08:00-18:00'; null: at any hour
    ADD COLUMN intake_hours text[],
    -- local dates (in intake_time_zone) on which the partner takes nothing, from 00:00 to 24:00
    ADD COLUMN blackout_dates date[] NOT NULL DEFAULT '{}',
    ADD CONSTRAINT ck_destinations_intake_time_zone CHECK (intake_time_zone_ok(intake_time_zone)),
    -- bounded, so the next opening is always found within next_window_opening's horizon
    ADD CONSTRAINT ck_destinations_blackout_dates
        CHECK (cardinality(blackout_dates) <= 366 AND array_position(blackout_dates, NULL) IS NULL);

ALTER TABLE destinations
    -- intake_hours as minutes of the week, computed by the database (nobody writes it)
    ADD COLUMN intake_week int4multirange GENERATED ALWAYS AS (intake_week_of(intake_hours)) STORED,
    -- well formed: their minutes of the week could be computed
    ADD CONSTRAINT ck_destinations_intake_hours CHECK ((intake_hours IS NULL) = (intake_week IS NULL));

-- -- the rule -------------------------------------------------------------------------------------------

-- Whether the destination's partner takes deliveries at ``at`` (wall clock in its time zone; see above).
-- Reads only the row it is given: cutoff 2 passes the row it holds FOR SHARE. A destination with no window
-- answers at once.
CREATE FUNCTION delivery_window_open(d destinations, at timestamptz) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT d.intake_week IS NULL AND cardinality(d.blackout_dates) = 0
           OR (SELECT NOT (w::date = ANY (d.blackout_dates))
                      AND (d.intake_week IS NULL
                           OR d.intake_week @> ((extract(isodow FROM w)::int - 1) * 1440
                                                + extract(hour FROM w)::int * 60 + extract(minute FROM w)::int))
               FROM (SELECT at AT TIME ZONE d.intake_time_zone AS w) AS wall)
$$;

-- The instants whose wall-clock time in ``tz`` is ``wall``: one on most days, two in the hour a DST change
-- repeats, none in the hour it skips (AT TIME ZONE alone picks one of two, or an hour off in a skipped one).
-- The UTC offsets a day before and a day after bracket any change: a wall time is valid at an offset if that
-- instant reads back as the same wall time.
CREATE FUNCTION wall_clock_instants(wall timestamp, tz text) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    guess constant timestamptz := wall AT TIME ZONE tz;
    before_offset interval;
    after_offset interval;
    earlier timestamptz;
    later timestamptz;
BEGIN
    before_offset := ((guess - interval '1 day') AT TIME ZONE tz) - ((guess - interval '1 day') AT TIME ZONE 'UTC');
    after_offset := ((guess + interval '1 day') AT TIME ZONE tz) - ((guess + interval '1 day') AT TIME ZONE 'UTC');
    earlier := (wall - before_offset) AT TIME ZONE 'UTC';
    later := (wall - after_offset) AT TIME ZONE 'UTC';
    IF later < earlier THEN
        SELECT later, earlier INTO earlier, later;
    END IF;
    IF (earlier AT TIME ZONE tz) = wall THEN
        RETURN NEXT earlier;
    END IF;
    IF later <> earlier AND (later AT TIME ZONE tz) = wall THEN
        RETURN NEXT later;
    END IF;
END $$;

-- The instant of the UTC offset change of ``tz`` between ``low`` and ``high``, if their offsets differ (the
-- first instant with ``high``'s offset, to the second: zones change on whole seconds); else none.
CREATE FUNCTION offset_change_between(low timestamptz, high timestamptz, tz text) RETURNS SETOF timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    lo bigint := floor(extract(epoch FROM low));
    hi bigint := ceil(extract(epoch FROM high));
    target constant interval := (high AT TIME ZONE tz) - (high AT TIME ZONE 'UTC');
    mid bigint;
BEGIN
    IF (low AT TIME ZONE tz) - (low AT TIME ZONE 'UTC') = target THEN
        RETURN;
    END IF;
    WHILE hi - lo > 1 LOOP
        mid := (lo + hi) / 2;
        IF (to_timestamp(mid) AT TIME ZONE tz) - (to_timestamp(mid) AT TIME ZONE 'UTC') = target THEN
            hi := mid;
        ELSE
            lo := mid;
        END IF;
    END LOOP;
    RETURN NEXT to_timestamp(hi);
END $$;

-- The first instant at or after ``at`` when the window is open: ``at`` itself when it is open now. Whether
-- the window is open changes only where the wall clock reaches an opening or a midnight (a blackout date
-- ends) or jumps (a DST change), so each local day's candidates are those instants, and the earliest open
-- one after ``at`` is the answer. Null when none opens within 400 days (the blackout dates are bounded to
-- 366 and every intake hours entry opens once a week, so this is never null for a valid row).
CREATE FUNCTION next_window_opening(d destinations, at timestamptz) RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE AS $$
DECLARE
    tz constant text := d.intake_time_zone;
    first_day date;
    day date;
    best timestamptz;
    candidate timestamptz;
    opens_at int[];
BEGIN
    IF delivery_window_open(d, at) THEN
        RETURN at;
    END IF;
    first_day := (at AT TIME ZONE tz)::date;
    -- each entry's opening minutes of the day, by ISO day of the week (1 = Monday)
    FOR i IN 0..400 LOOP
        day := first_day + i;
        CONTINUE WHEN day = ANY (d.blackout_dates);
        -- the day's openings (a range's start; one that only continues past the week's end adds a harmless
        -- candidate, where the window is already open)
        SELECT coalesce(array_agg(DISTINCT lower(r) % 1440), '{}') INTO opens_at
        FROM unnest(coalesce(d.intake_week, '{}'::int4multirange)) AS r
        WHERE lower(r) / 1440 = extract(isodow FROM day)::int - 1;
        best := NULL;
        FOR candidate IN
            SELECT x FROM unnest(array_append(opens_at, 0)) AS o(minute),
                          LATERAL wall_clock_instants(day + make_interval(mins => o.minute), tz) AS x
            UNION ALL
            SELECT x FROM offset_change_between(day::timestamp AT TIME ZONE tz,
                                                (day + 1)::timestamp AT TIME ZONE tz, tz) AS x
        LOOP
            IF candidate > at AND (best IS NULL OR candidate < best) AND delivery_window_open(d, candidate) THEN
                best := candidate;
            END IF;
        END LOOP;
        IF best IS NOT NULL THEN
            RETURN best;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

-- -- what a window is not --------------------------------------------------------------------------------

-- Not a delivery term: an edit of the window needs no rebuild (cutoff 2 and the rename fence read it as it
-- is now). Composed over the list the earlier migrations keep, so a term another migration excludes stays
-- excluded whichever of the two is applied first.
ALTER FUNCTION destination_delivery_terms(destinations) RENAME TO destination_delivery_terms_before_windows;

CREATE FUNCTION destination_delivery_terms(d destinations) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT destination_delivery_terms_before_windows(d)
       - ARRAY['intake_time_zone', 'intake_hours', 'blackout_dates', 'intake_week']
$$;

-- -- a claim outside the window waits -------------------------------------------------------------------

-- Replaces 0016's guard. available_at is still written by a give-back (Running -> Queued), and now also by
-- a claim outside the job's delivery window, which leaves the job Queued and makes it wait for the next
-- opening: only while its destination's window is closed, only until an instant when it is open, and only
-- later than a wait it already has, never sooner. So still no writer can make a waiting job claimable early,
-- nor make a job wait by hand for anything but its partner's window. The count of counted give-backs still
-- only grows.
CREATE OR REPLACE FUNCTION export_jobs_backoff_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.transient_releases < OLD.transient_releases THEN
        RAISE EXCEPTION 'export %: the count of give-backs for failures never decreases', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (OLD.status = 'Running' AND NEW.status = 'Queued')
       AND NOT (OLD.status = 'Queued' AND NEW.status = 'Queued' AND NEW.available_at IS NOT NULL
                AND (OLD.available_at IS NULL OR NEW.available_at > OLD.available_at)
                AND EXISTS (SELECT 1 FROM destinations d
                            WHERE d.tenant_id = NEW.tenant_id AND d.id = NEW.destination_id
                              AND NOT delivery_window_open(d, clock_timestamp())
                              AND delivery_window_open(d, NEW.available_at))) THEN
        RAISE EXCEPTION 'export %: available_at is written only by a give-back (Running -> Queued), or moved later '
                        'to its delivery window''s opening for a Queued job outside it', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    RETURN NEW;
END $$;

-- -- grants ---------------------------------------------------------------------------------------------

-- An admin sets the window (a recorded version, 0021's statements).
GRANT UPDATE (intake_time_zone, intake_hours, blackout_dates) ON destinations TO exports_api;

REVOKE ALL ON FUNCTION intake_ranges(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION intake_week_of(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION intake_time_zone_ok(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION delivery_window_open(destinations, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION wall_clock_instants(timestamp, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION offset_change_between(timestamptz, timestamptz, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION next_window_opening(destinations, timestamptz) FROM PUBLIC;
-- the claim, cutoff 2, the release and the rename fence (the worker); the destination's checks and the
-- console's "next opening" (the API); destination_delivery_terms keeps the default grant, as 0021's did (the
-- guard runs it for every writer)
GRANT EXECUTE ON FUNCTION intake_ranges(text[]), delivery_window_open(destinations, timestamptz),
    wall_clock_instants(timestamp, text), offset_change_between(timestamptz, timestamptz, text),
    next_window_opening(destinations, timestamptz)
    TO exports_worker, exports_api;
GRANT EXECUTE ON FUNCTION intake_week_of(text[]), intake_time_zone_ok(text) TO exports_api;
