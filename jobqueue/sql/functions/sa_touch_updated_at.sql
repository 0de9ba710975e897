-- Keeps updated_at on sa_entity and sa_job.
-- NOTE: clock_timestamp(), not now(): /mission/recent hands out cursors bounded by the
-- start of the oldest open transaction, which is only safe when a row's stamp is taken
-- at write time (never earlier than the moment it became possible to write it).
CREATE OR REPLACE FUNCTION sa_touch_updated_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.updated_at := clock_timestamp();
    RETURN NEW;
END;
$$;

CREATE OR REPLACE TRIGGER sa_entity_touch BEFORE UPDATE ON public.sa_entity FOR EACH ROW EXECUTE FUNCTION sa_touch_updated_at();
CREATE OR REPLACE TRIGGER sa_job_touch BEFORE UPDATE ON public.sa_job FOR EACH ROW EXECUTE FUNCTION sa_touch_updated_at();
