-- A skipped recurring firing reports itself (issue 26 item 1, with issue 25's recurring exports, 0023): the
-- firing's row, appended with outcome 'skipped' in the firing's own transaction (record_recurring_firing),
-- writes its recurring_export.firing_skipped event through notify_recurring_firing_skipped (0025), one per
-- recurring export and nominal time. A trigger, as for the exports' outcomes, so no statement of the recurring
-- code changes and every writer of a skipped firing is covered. The event names the recurring export by its
-- list and destination (recurring exports have no name of their own) and carries the firing's reason code.

CREATE FUNCTION notify_recurring_firing_row() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
BEGIN
    PERFORM notify_recurring_firing_skipped(
        NEW.tenant_id, NEW.recurring_export_id,
        (SELECT r.list_name || ' to ' || coalesce(d.name, r.destination_id::text)
         FROM recurring_exports r
         LEFT JOIN destinations d ON d.tenant_id = r.tenant_id AND d.id = r.destination_id
         WHERE r.tenant_id = NEW.tenant_id AND r.id = NEW.recurring_export_id),
        NEW.nominal_time, NEW.reason);
    RETURN NULL;
END $$;

REVOKE ALL ON FUNCTION notify_recurring_firing_row() FROM PUBLIC;

CREATE TRIGGER tr_recurring_export_firings_notify_skipped
    AFTER INSERT ON recurring_export_firings
    FOR EACH ROW
    WHEN (NEW.outcome = 'skipped')
    EXECUTE FUNCTION notify_recurring_firing_row();
