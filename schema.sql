-- outbox's schema at revision 0027, as PostgreSQL 18 dumps it. Generated from the migrations
-- by `python -m tests.schema_dump`; do not edit: the revisions in migrations/versions/ are the source.

--
-- PostgreSQL database dump
--

SET statement_timeout = 0;
SET lock_timeout = 0;
SET idle_in_transaction_session_timeout = 0;
SET transaction_timeout = 0;
SET client_encoding = 'UTF8';
SET standard_conforming_strings = on;
SELECT pg_catalog.set_config('search_path', '', false);
SET check_function_bodies = false;
SET xmloption = content;
SET client_min_messages = warning;
SET row_security = off;

--
-- Name: after_agent_action_delete(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.after_agent_action_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM hold_agent_lanes(ARRAY[OLD.lane_key]);
    RETURN NULL;
END
$$;

--
-- Name: after_agent_action_move(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.after_agent_action_move() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.state IN ('DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED') THEN
        INSERT INTO agent_action_ended_tally (kind, state, reason, n) VALUES (NEW.kind, NEW.state, NEW.stop_reason, 1);
    END IF;
    IF (OLD.lane_head AND NOT NEW.lane_head) OR (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED') THEN
        PERFORM hold_agent_lanes(ARRAY[NEW.lane_key]);
    END IF;
    RETURN NULL;
END
$$;

--
-- Name: default_agent_action_destination(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.default_agent_action_destination() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.destination := CASE
        WHEN NEW.kind = 'EMAIL' THEN 'smtp'
        WHEN NEW.kind = 'NATS_EVENT' THEN 'nats'
        WHEN NEW.kind = 'SLACK_MESSAGE' THEN 'slack'
        WHEN NEW.kind = 'GITHUB_POST' THEN 'github'
        WHEN NEW.kind = 'GITLAB_POST' THEN 'gitlab'
        ELSE lower(NEW.kind)
    END;
    RETURN NEW;
END $$;

--
-- Name: guard_agent_action(); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.guard_agent_action() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    -- the kind's row (agent_action_kind), read once on INSERT
    may_run_alone boolean;
    may_run_in_workspace boolean;
    ended CONSTANT text[] := ARRAY['DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'];
    is_claim boolean;
    holder_id bigint;
    holder_state text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.state NOT IN ('PROPOSED', 'ADMITTED') THEN
            RAISE EXCEPTION 'agent_action: a new action is PROPOSED or ADMITTED, not %', NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.attempt <> 0 OR NEW.epoch <> 0 OR NEW.lease_expires_at IS NOT NULL
           OR NEW.write_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'agent_action: a new action has no attempt, epoch, lease or write'
                USING ERRCODE = 'check_violation';
        END IF;
        -- where the kind may run; a kind without a row finds none here, and fk_agent_action_kind refuses it
        SELECT k.instance_level, k.workspace_level INTO may_run_alone, may_run_in_workspace
          FROM agent_action_kind AS k WHERE k.name = NEW.kind;
        IF NEW.workspace_id IS NULL AND NOT may_run_alone THEN
            RAISE EXCEPTION 'agent_action: % is not instance level (agent_action_kind.instance_level): it needs a workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.workspace_id IS NOT NULL AND NOT may_run_in_workspace THEN
            RAISE EXCEPTION 'agent_action: % is not workspace level (agent_action_kind.workspace_level): it takes no workspace_id',
                NEW.kind USING ERRCODE = 'check_violation';
        END IF;

        -- The lane's holder (a new snapshot: every holder committed so far, and the rows this statement inserted
        -- before this one), locked until this transaction ends: its end waits for us, then sees this action.
        -- A waiting holder from ux_agent_action_lane_head, else the executing one from
        -- ux_agent_action_lane_executing (looked for second: a waiting holder claimed meanwhile is found there).
        -- No holder: this action holds the lane; ux_agent_action_lane_head refuses a second one that an
        -- enqueue into the same lane, not committed yet, marked meanwhile.
        NEW.lane_head := false;
        SELECT h.id, h.state INTO holder_id, holder_state
          FROM agent_action AS h WHERE h.lane_key = NEW.lane_key AND h.lane_head AND h.state IN ('PROPOSED', 'ADMITTED')
           FOR KEY SHARE;
        IF NOT FOUND THEN
            SELECT h.id, h.state INTO holder_id, holder_state
              FROM agent_action AS h WHERE h.lane_key = NEW.lane_key AND h.state = 'EXECUTING' AND h.lane_head
               FOR KEY SHARE;
        END IF;
        IF NOT FOUND THEN
            NEW.lane_head := true;
        ELSIF holder_state <> 'EXECUTING' AND holder_id > NEW.id
              AND NOT EXISTS (SELECT 1 FROM agent_action AS d WHERE d.idempotency_key = NEW.idempotency_key) THEN
            -- an earlier action (its transaction took its id first, and committed later) holds the lane
            -- before a later one that has not started; a repeated key inserts nothing, so it takes nothing
            UPDATE agent_action SET lane_head = false
             WHERE id = holder_id AND lane_head AND state IN ('PROPOSED', 'ADMITTED');
            NEW.lane_head := FOUND;
        END IF;
        -- a lane that may start now wakes the idle executors when this transaction commits
        IF NEW.lane_head AND NEW.state = 'ADMITTED' AND NEW.due_at <= now() THEN
            PERFORM pg_notify('outbox_action', '');
        END IF;
        RETURN NEW;
    END IF;

    IF OLD.state = ANY (ended) THEN
        RAISE EXCEPTION 'agent_action %: an ended action (%) never changes', OLD.id, OLD.state
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.id <> OLD.id OR NEW.kind <> OLD.kind OR NEW.lane_key <> OLD.lane_key
       OR NEW.idempotency_key <> OLD.idempotency_key THEN
        RAISE EXCEPTION 'agent_action %: id, kind, lane_key and idempotency_key never change', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;

    -- A claim moves an action to EXECUTING, or takes an EXECUTING one again: the epoch rises.
    is_claim := NEW.state = 'EXECUTING' AND (OLD.state <> 'EXECUTING' OR NEW.epoch <> OLD.epoch);

    IF NEW.state <> OLD.state OR NEW.epoch <> OLD.epoch THEN
        IF NOT (
            (OLD.state = 'PROPOSED' AND NEW.state IN ('ADMITTED', 'CANCELLED'))
            OR (OLD.state = 'ADMITTED' AND NEW.state IN ('EXECUTING', 'CANCELLED'))
            OR (OLD.state = 'EXECUTING' AND NEW.state IN
                ('EXECUTING', 'ADMITTED', 'DONE', 'UNCERTAIN', 'FAILED', 'CANCELLED'))
        ) OR (NEW.epoch <> OLD.epoch AND NOT is_claim) THEN
            RAISE EXCEPTION 'agent_action %: % -> % is not an allowed transition', OLD.id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF is_claim THEN
        IF NEW.epoch <> OLD.epoch + 1 OR NEW.attempt <> OLD.attempt + 1 THEN
            RAISE EXCEPTION 'agent_action %: a claim raises epoch and attempt by exactly one', OLD.id
                USING ERRCODE = 'check_violation';
        END IF;
        -- an at-most-once kind is never reclaimed after its write started: nothing can tell whether the
        -- earlier attempt reached the provider. The kind's row is read here only, after a write started.
        IF OLD.state = 'EXECUTING' AND OLD.write_started_at IS NOT NULL THEN
            IF (SELECT k.at_most_once FROM agent_action_kind AS k WHERE k.name = OLD.kind) THEN
                RAISE EXCEPTION 'agent_action %: % is at most once and its write started; it is never claimed again',
                    OLD.id, OLD.kind USING ERRCODE = 'check_violation';
            END IF;
        END IF;
        IF NEW.lease_expires_at IS NULL THEN
            RAISE EXCEPTION 'agent_action %: a claim sets the lease', OLD.id USING ERRCODE = 'check_violation';
        END IF;
    END IF;

    IF NOT is_claim AND NEW.attempt <> OLD.attempt
       AND NOT (OLD.state = 'EXECUTING' AND NEW.state = 'ADMITTED' AND NEW.attempt = OLD.attempt - 1) THEN
        RAISE EXCEPTION 'agent_action %: attempt rises by exactly one with a claim, and falls by one only when an attempt that does not count goes back',
            OLD.id USING ERRCODE = 'check_violation';
    END IF;

    IF NEW.state = ANY (ended) THEN
        IF NEW.stop_reason IS NULL THEN
            RAISE EXCEPTION 'agent_action %: ending as % needs a stop_reason', OLD.id, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        IF OLD.lane_head THEN
            -- the holder's end waits for the enqueues behind it that have not committed (they hold its row
            -- FOR KEY SHARE), so the next holder is chosen among them too
            PERFORM 1 FROM agent_action WHERE id = OLD.id FOR UPDATE;
        END IF;
        NEW.ended_at := now();
        NEW.payload := NULL;
        NEW.lease_expires_at := NULL;
        NEW.lane_head := false;
    ELSIF NEW.state <> 'EXECUTING' THEN
        NEW.lease_expires_at := NULL;
    END IF;
    RETURN NEW;
END
$$;

--
-- Name: hold_agent_lanes(text[]); Type: FUNCTION; Schema: public; Owner: -
--

CREATE FUNCTION public.hold_agent_lanes(lanes text[]) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    holders bigint[];
    unmarked bigint[];
    marked integer;
    wake boolean := false;
    woken boolean;
BEGIN
    LOOP
        -- the executing action from ux_agent_action_lane_executing, the oldest waiting one from
        -- ix_agent_action_lane_pending: one probe each, however many actions wait
        WITH wanted AS MATERIALIZED (
            SELECT coalesce(x.id, p.id) AS id, coalesce(x.lane_head, p.lane_head) AS lane_head
              FROM unnest(lanes) AS k (lane_key)
              LEFT JOIN LATERAL (
                SELECT e.id, e.lane_head FROM agent_action AS e
                 WHERE e.lane_key = k.lane_key AND e.state = 'EXECUTING'
              ) AS x ON true
              LEFT JOIN LATERAL (
                SELECT w.id, w.lane_head FROM agent_action AS w
                 WHERE w.lane_key = k.lane_key AND w.state IN ('PROPOSED', 'ADMITTED')
                 ORDER BY w.id LIMIT 1
              ) AS p ON true
        )
        SELECT coalesce(array_agg(id) FILTER (WHERE id IS NOT NULL), '{}'),
               coalesce(array_agg(id) FILTER (WHERE id IS NOT NULL AND NOT lane_head), '{}')
          INTO holders, unmarked
          FROM wanted;
        EXIT WHEN cardinality(unmarked) = 0;
        -- a holder that is no longer the rule's (a retried one, behind an earlier action not started) lets go;
        -- an executing action is always its lane's holder
        UPDATE agent_action SET lane_head = false
         WHERE lane_key = ANY (lanes) AND lane_head AND state IN ('PROPOSED', 'ADMITTED') AND NOT (id = ANY (holders));
        WITH now_held AS (
            UPDATE agent_action SET lane_head = true
             WHERE id = ANY (unmarked) AND NOT lane_head AND state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')
            RETURNING state, due_at
        )
        SELECT count(*), coalesce(bool_or(state = 'ADMITTED' AND due_at <= now()), false) INTO marked, woken
          FROM now_held;
        wake := wake OR woken;
        EXIT WHEN marked = cardinality(unmarked);
    END LOOP;
    -- a lane whose next action may start now wakes the idle executors when this transaction commits
    IF wake THEN
        PERFORM pg_notify('outbox_action', '');
    END IF;
END
$$;

SET default_tablespace = '';

SET default_table_access_method = heap;

--
-- Name: agent_action; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_action (
    id bigint NOT NULL,
    kind text NOT NULL,
    workspace_id bigint,
    lane_key text NOT NULL,
    idempotency_key text NOT NULL,
    payload jsonb,
    subject_account_id bigint,
    max_attempts integer NOT NULL,
    expires_at timestamp with time zone,
    state text NOT NULL,
    attempt integer DEFAULT 0 NOT NULL,
    epoch bigint DEFAULT 0 NOT NULL,
    due_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_expires_at timestamp with time zone,
    write_started_at timestamp with time zone,
    stop_reason text,
    readback_ref text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    ended_at timestamp with time zone,
    last_error text,
    trace jsonb,
    lane_head boolean DEFAULT false NOT NULL,
    trace_context jsonb,
    destination text,
    due_since timestamp with time zone,
    CONSTRAINT ck_agent_action_attempt CHECK (((attempt >= 0) AND (attempt <= max_attempts))),
    CONSTRAINT ck_agent_action_ended_at CHECK (((ended_at IS NULL) = (stop_reason IS NULL))),
    CONSTRAINT ck_agent_action_idempotency_key CHECK ((idempotency_key <> ''::text)),
    CONSTRAINT ck_agent_action_lane_key CHECK ((lane_key <> ''::text)),
    CONSTRAINT ck_agent_action_last_error CHECK ((char_length(last_error) <= 500)),
    CONSTRAINT ck_agent_action_max_attempts CHECK ((max_attempts > 0)),
    CONSTRAINT ck_agent_action_state CHECK ((state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text, 'EXECUTING'::text, 'DONE'::text, 'UNCERTAIN'::text, 'FAILED'::text, 'CANCELLED'::text]))),
    CONSTRAINT ck_agent_action_stop_reason CHECK (
CASE state
    WHEN 'DONE'::text THEN (stop_reason = 'CONFIRMED'::text)
    WHEN 'FAILED'::text THEN (stop_reason = ANY (ARRAY['PROVIDER_REFUSED'::text, 'ATTEMPTS_EXHAUSTED'::text]))
    WHEN 'UNCERTAIN'::text THEN (stop_reason = ANY (ARRAY['PROVIDER_UNCERTAIN'::text, 'ERROR_AFTER_WRITE'::text, 'LEASE_LOST_AFTER_WRITE'::text]))
    WHEN 'CANCELLED'::text THEN (stop_reason = ANY (ARRAY['EXPIRED'::text, 'PROPOSAL_REFUSED'::text, 'NOT_WANTED'::text, 'OPERATOR_CANCELLED'::text]))
    ELSE (stop_reason IS NULL)
END),
    CONSTRAINT ck_agent_action_trace CHECK (((jsonb_typeof(trace) = 'object'::text) AND (char_length((trace)::text) <= 500)))
)
WITH (autovacuum_vacuum_scale_factor='0.02', autovacuum_analyze_scale_factor='0.02', fillfactor='60');

--
-- Name: agent_action_attempt_tally; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_action_attempt_tally (
    id bigint NOT NULL,
    kind text NOT NULL,
    result text NOT NULL,
    recorded boolean NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT agent_action_attempt_tally_n_check CHECK ((n > 0)),
    CONSTRAINT agent_action_attempt_tally_result_check CHECK ((result = ANY (ARRAY['DONE'::text, 'RETRY'::text, 'DEFER'::text, 'OUTBOX_FAULT'::text, 'UNCERTAIN'::text, 'FAILED'::text, 'CANCELLED'::text, 'ABANDONED'::text])))
);

--
-- Name: agent_action_attempt_tally_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.agent_action_attempt_tally ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.agent_action_attempt_tally_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: agent_action_ended_tally; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_action_ended_tally (
    id bigint NOT NULL,
    kind text NOT NULL,
    state text NOT NULL,
    reason text NOT NULL,
    n bigint NOT NULL,
    CONSTRAINT agent_action_ended_tally_n_check CHECK ((n > 0))
);

--
-- Name: agent_action_ended_tally_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.agent_action_ended_tally ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.agent_action_ended_tally_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: agent_action_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.agent_action ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.agent_action_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: agent_action_kind; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_action_kind (
    name text NOT NULL,
    at_most_once boolean NOT NULL,
    instance_level boolean NOT NULL,
    workspace_level boolean NOT NULL,
    CONSTRAINT ck_agent_action_kind_level CHECK ((instance_level OR workspace_level)),
    CONSTRAINT ck_agent_action_kind_name CHECK ((name ~ '^[A-Z0-9_]*[A-Z][A-Z0-9_]*$'::text))
);

--
-- Name: agent_action_latency_tally; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_action_latency_tally (
    id bigint NOT NULL,
    kind text NOT NULL,
    metric text NOT NULL,
    le double precision NOT NULL,
    n bigint NOT NULL,
    total double precision NOT NULL,
    CONSTRAINT agent_action_latency_tally_metric_check CHECK ((metric = ANY (ARRAY['attempt_duration'::text, 'pickup_delay'::text]))),
    CONSTRAINT agent_action_latency_tally_n_check CHECK ((n > 0))
);

--
-- Name: agent_action_latency_tally_id_seq; Type: SEQUENCE; Schema: public; Owner: -
--

ALTER TABLE public.agent_action_latency_tally ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.agent_action_latency_tally_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: agent_destination; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_destination (
    name text NOT NULL,
    kind text NOT NULL,
    rate double precision,
    burst double precision DEFAULT 1 NOT NULL,
    pace double precision,
    pace_at timestamp with time zone,
    tokens double precision DEFAULT 1 NOT NULL,
    tokens_at timestamp with time zone DEFAULT now() NOT NULL,
    paused_until timestamp with time zone,
    paused_by text,
    pause_reason text,
    slow_downs integer DEFAULT 0 NOT NULL,
    broken_since timestamp with time zone,
    probe_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    send_tokens double precision,
    send_tokens_at timestamp with time zone,
    slowed_at timestamp with time zone,
    failing_since timestamp with time zone,
    failures integer DEFAULT 0 NOT NULL,
    credentials_refused_at timestamp with time zone,
    credentials_reason text,
    CONSTRAINT ck_agent_destination_burst CHECK (((burst >= (1)::double precision) AND (burst <= (1000000)::double precision))),
    CONSTRAINT ck_agent_destination_credentials_reason CHECK ((char_length(credentials_reason) <= 500)),
    CONSTRAINT ck_agent_destination_name CHECK ((name ~ '^[a-z0-9_][a-z0-9_.:-]{0,79}$'::text)),
    CONSTRAINT ck_agent_destination_pace CHECK ((pace > (0)::double precision)),
    CONSTRAINT ck_agent_destination_pause_reason CHECK ((char_length(pause_reason) <= 500)),
    CONSTRAINT ck_agent_destination_paused_by CHECK ((paused_by = ANY (ARRAY['provider'::text, 'operator'::text]))),
    CONSTRAINT ck_agent_destination_rate CHECK (((rate > (0)::double precision) AND (rate <= (1000000)::double precision)))
);

--
-- Name: agent_executor; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_executor (
    executor_id text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    seen_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: agent_maintenance; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.agent_maintenance (
    job text NOT NULL,
    last_success_at timestamp with time zone NOT NULL,
    last_removed bigint NOT NULL
);

--
-- Name: outbox_alembic_version; Type: TABLE; Schema: public; Owner: -
--

CREATE TABLE public.outbox_alembic_version (
    version_num character varying(32) NOT NULL
);

--
-- Name: agent_action_attempt_tally agent_action_attempt_tally_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action_attempt_tally
    ADD CONSTRAINT agent_action_attempt_tally_pkey PRIMARY KEY (id);

--
-- Name: agent_action_ended_tally agent_action_ended_tally_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action_ended_tally
    ADD CONSTRAINT agent_action_ended_tally_pkey PRIMARY KEY (id);

--
-- Name: agent_action_kind agent_action_kind_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action_kind
    ADD CONSTRAINT agent_action_kind_pkey PRIMARY KEY (name);

--
-- Name: agent_action_latency_tally agent_action_latency_tally_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action_latency_tally
    ADD CONSTRAINT agent_action_latency_tally_pkey PRIMARY KEY (id);

--
-- Name: agent_action agent_action_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action
    ADD CONSTRAINT agent_action_pkey PRIMARY KEY (id);

--
-- Name: agent_destination agent_destination_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_destination
    ADD CONSTRAINT agent_destination_pkey PRIMARY KEY (name);

--
-- Name: agent_executor agent_executor_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_executor
    ADD CONSTRAINT agent_executor_pkey PRIMARY KEY (executor_id);

--
-- Name: agent_maintenance agent_maintenance_pkey; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_maintenance
    ADD CONSTRAINT agent_maintenance_pkey PRIMARY KEY (job);

--
-- Name: agent_action ck_agent_action_destination; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.agent_action
    ADD CONSTRAINT ck_agent_action_destination CHECK ((((destination IS NOT NULL) OR (ended_at IS NOT NULL)) AND (char_length(destination) <= 80))) NOT VALID;

--
-- Name: agent_action ck_agent_action_trace_context; Type: CHECK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE public.agent_action
    ADD CONSTRAINT ck_agent_action_trace_context CHECK (((jsonb_typeof(trace_context) = 'object'::text) AND (char_length((trace_context)::text) <= 1024))) NOT VALID;

--
-- Name: outbox_alembic_version outbox_alembic_version_pkc; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.outbox_alembic_version
    ADD CONSTRAINT outbox_alembic_version_pkc PRIMARY KEY (version_num);

--
-- Name: agent_action ux_agent_action_idempotency_key; Type: CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action
    ADD CONSTRAINT ux_agent_action_idempotency_key UNIQUE (idempotency_key);

--
-- Name: ix_agent_action_admitted_due; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_admitted_due ON public.agent_action USING btree (due_at) WHERE (state = 'ADMITTED'::text);

--
-- Name: ix_agent_action_ended; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_ended ON public.agent_action USING btree (ended_at) WHERE (ended_at IS NOT NULL);

--
-- Name: ix_agent_action_expires; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_expires ON public.agent_action USING btree (expires_at) WHERE ((state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text])) AND (expires_at IS NOT NULL));

--
-- Name: ix_agent_action_lane_pending; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_lane_pending ON public.agent_action USING btree (lane_key, id) WHERE (state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text]));

--
-- Name: ix_agent_action_ready; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_ready ON public.agent_action USING btree (due_at) WHERE (lane_head AND (state = 'ADMITTED'::text));

--
-- Name: ix_agent_action_ready_destination; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_ready_destination ON public.agent_action USING btree (destination, kind, due_at) WHERE (lane_head AND (state = 'ADMITTED'::text));

--
-- Name: ix_agent_action_state_created; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_state_created ON public.agent_action USING btree (state, created_at, id) INCLUDE (kind) WHERE (state <> 'EXECUTING'::text);

--
-- Name: ix_agent_action_subject; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_subject ON public.agent_action USING btree (subject_account_id) WHERE (subject_account_id IS NOT NULL);

--
-- Name: ix_agent_action_uncertain; Type: INDEX; Schema: public; Owner: -
--

CREATE INDEX ix_agent_action_uncertain ON public.agent_action USING btree (ended_at) INCLUDE (kind, stop_reason) WHERE (state = 'UNCERTAIN'::text);

--
-- Name: ux_agent_action_lane_executing; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX ux_agent_action_lane_executing ON public.agent_action USING btree (lane_key) WHERE (state = 'EXECUTING'::text);

--
-- Name: ux_agent_action_lane_head; Type: INDEX; Schema: public; Owner: -
--

CREATE UNIQUE INDEX ux_agent_action_lane_head ON public.agent_action USING btree (lane_key) WHERE lane_head;

--
-- Name: agent_action after_agent_action_delete; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER after_agent_action_delete AFTER DELETE ON public.agent_action FOR EACH ROW WHEN (old.lane_head) EXECUTE FUNCTION public.after_agent_action_delete();

--
-- Name: agent_action after_agent_action_move; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER after_agent_action_move AFTER UPDATE ON public.agent_action FOR EACH ROW WHEN (((old.state <> new.state) AND ((new.state = ANY (ARRAY['DONE'::text, 'UNCERTAIN'::text, 'FAILED'::text, 'CANCELLED'::text])) OR (old.lane_head AND (NOT new.lane_head)) OR ((old.state = 'EXECUTING'::text) AND (new.state = 'ADMITTED'::text))) AND (current_setting('outbox.own_ends'::text, true) IS DISTINCT FROM 'written'::text))) EXECUTE FUNCTION public.after_agent_action_move();

--
-- Name: agent_action default_agent_action_destination; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER default_agent_action_destination BEFORE INSERT ON public.agent_action FOR EACH ROW WHEN ((new.destination IS NULL)) EXECUTE FUNCTION public.default_agent_action_destination();

--
-- Name: agent_action guard_agent_action; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER guard_agent_action BEFORE UPDATE ON public.agent_action FOR EACH ROW WHEN ((((new.id = old.id) AND (new.kind = old.kind) AND (new.lane_key = old.lane_key) AND (new.idempotency_key = old.idempotency_key) AND (((new.state = 'EXECUTING'::text) AND ((old.state = 'ADMITTED'::text) OR ((old.state = 'EXECUTING'::text) AND (old.write_started_at IS NULL))) AND (new.epoch = (old.epoch + 1)) AND (new.attempt = (old.attempt + 1)) AND (new.lease_expires_at IS NOT NULL)) OR ((new.state = old.state) AND (old.state = ANY (ARRAY['PROPOSED'::text, 'ADMITTED'::text, 'EXECUTING'::text])) AND (new.epoch = old.epoch) AND (new.attempt = old.attempt) AND ((new.state = 'EXECUTING'::text) OR (new.lease_expires_at IS NULL))) OR ((old.state = 'EXECUTING'::text) AND (new.state = 'ADMITTED'::text) AND (new.epoch = old.epoch) AND ((new.attempt = old.attempt) OR (new.attempt = (old.attempt - 1))) AND (new.lease_expires_at IS NULL)) OR ((old.state = 'EXECUTING'::text) AND (new.state = ANY (ARRAY['DONE'::text, 'FAILED'::text, 'UNCERTAIN'::text, 'CANCELLED'::text])) AND (new.epoch = old.epoch) AND (new.attempt = old.attempt) AND (new.stop_reason IS NOT NULL) AND (new.ended_at = now()) AND (new.payload IS NULL) AND (new.lease_expires_at IS NULL) AND (NOT new.lane_head)))) IS NOT TRUE)) EXECUTE FUNCTION public.guard_agent_action();

--
-- Name: agent_action guard_agent_action_insert; Type: TRIGGER; Schema: public; Owner: -
--

CREATE TRIGGER guard_agent_action_insert BEFORE INSERT ON public.agent_action FOR EACH ROW EXECUTE FUNCTION public.guard_agent_action();

--
-- Name: agent_destination agent_destination_kind_fkey; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_destination
    ADD CONSTRAINT agent_destination_kind_fkey FOREIGN KEY (kind) REFERENCES public.agent_action_kind(name);

--
-- Name: agent_action fk_agent_action_kind; Type: FK CONSTRAINT; Schema: public; Owner: -
--

ALTER TABLE ONLY public.agent_action
    ADD CONSTRAINT fk_agent_action_kind FOREIGN KEY (kind) REFERENCES public.agent_action_kind(name);

--
-- PostgreSQL database dump complete
--
