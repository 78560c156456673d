-- The partner's cleanup agreement for an attempt's temporary files (seed 000: an interrupted upload "can still
-- leave partial contact data under the temporary name, which needs its own cleanup agreement"). 'keep', the
-- default, leaves them to the partner, as before; 'remove' lets the worker and recovery remove an attempt's
-- temporary and set-aside files once its export is recorded Failed: nothing of them was published, and a
-- removal can never publish anything either. Files of an OutcomeUnknown attempt are always kept, as evidence.
ALTER TABLE destinations
    ADD COLUMN temporary_files text NOT NULL DEFAULT 'keep'
        CONSTRAINT ck_destinations_temporary_files CHECK (temporary_files IN ('keep', 'remove'));
