-- ratewarden-postgres schema, version 1.
--
-- Run with search_path set to the store's schema: every object below lands
-- there, and the functions pin that search_path (SET search_path FROM
-- CURRENT) so that no caller's search_path can redirect their table names.
--
-- Keys are stored as sha256(key): any byte string is a valid key (10 KB,
-- invalid UTF-8, SQL syntax), and a btree index entry must stay under
-- 2.7 KB. No raw key, and so no client address, is ever stored.
--
-- All times are integer microseconds since the Unix epoch, as in
-- ratewarden_core::Timestamp. `expires_at` is garbage collection only: the
-- moment after which the row's state is equivalent to no row at all, plus
-- slack, rounded up to a multiple of the slack so that most updates leave it
-- unchanged (HOT updates, no index churn). It never decides an outcome.
--
-- fillfactor leaves room on each page for HOT updates of hot keys.

CREATE TABLE sliding_log (
    key_hash   bytea    PRIMARY KEY,
    -- Timestamps of admitted units, oldest first, at most `limit` of them.
    log        bigint[] NOT NULL,
    expires_at bigint   NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX sliding_log_expires_at ON sliding_log (expires_at);

CREATE TABLE fixed_window (
    key_hash   bytea  PRIMARY KEY,
    start_us   bigint NOT NULL,
    count      bigint NOT NULL,
    expires_at bigint NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX fixed_window_expires_at ON fixed_window (expires_at);

CREATE TABLE sliding_window (
    key_hash   bytea  PRIMARY KEY,
    start_us   bigint NOT NULL,
    current_count  bigint NOT NULL,
    previous_count bigint NOT NULL,
    expires_at bigint NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX sliding_window_expires_at ON sliding_window (expires_at);

CREATE TABLE gcra (
    key_hash   bytea  PRIMARY KEY,
    tat        bigint NOT NULL,
    expires_at bigint NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX gcra_expires_at ON gcra (expires_at);

-- Refusals worth keeping (an abuse log): the hashed key,
-- the rule when known, the policy that refused, and when. Kept until
-- `expires_at` (the retention), then swept like state rows.
CREATE TABLE abuse_events (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key_hash    bytea  NOT NULL,
    rule        text,
    refused_by  text,
    algorithm   text,
    limit_units bigint,
    window_us   bigint,
    cost        bigint,
    at_us       bigint NOT NULL,
    expires_at  bigint NOT NULL
);
CREATE INDEX abuse_events_expires_at ON abuse_events (expires_at);
CREATE INDEX abuse_events_key_hash ON abuse_events (key_hash, at_us);

-- The garbage-collection time for state that expires at `at`: at least
-- `slack` later, rounded up to a multiple of `slack`.
CREATE FUNCTION gc_at(at bigint, slack bigint) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN ((at + 2 * slack - 1) / slack) * slack;

-- The time of a decision: the caller's, or the server's in server-clock mode
-- (p_now IS NULL).
CREATE FUNCTION decision_now(p_now bigint) RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE
RETURN coalesce(p_now, floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

CREATE FUNCTION record_refusal(
    p_hash bytea, p_algorithm text, p_limit bigint, p_window bigint,
    p_cost bigint, p_now bigint, p_retention bigint
) RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
BEGIN ATOMIC
    INSERT INTO abuse_events
        (key_hash, algorithm, limit_units, window_us, cost, at_us, expires_at)
    SELECT p_hash, p_algorithm, p_limit, p_window, p_cost, p_now, p_now + p_retention
    WHERE p_retention IS NOT NULL;
END;

-- Each decide_* function transcribes ratewarden_core::algorithm exactly, in
-- bigint (every value stays below 2^53 by Policy's validation). It is called
-- as one statement per decision. Exactness under concurrency comes from the
-- row lock: SELECT ... FOR UPDATE waits for any concurrent decision on the
-- key and then reads its committed result (READ COMMITTED re-reads the
-- newest row version). A key without a row is created by INSERT ... ON
-- CONFLICT DO NOTHING; losing that race means another decision created it
-- first, so the loop decides again on the row that won. A refusal records
-- nothing: it writes no state (except that the sliding log drops entries
-- that have expired, exactly as the core algorithm does), and only an abuse
-- event when p_abuse_retention is not null.
--
-- Arguments: key, limit, window (µs), cost, now (µs, NULL = server clock),
-- GC slack (µs, > 0), abuse-event retention (µs, NULL = do not record).

CREATE FUNCTION decide_sliding_log(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint, p_abuse_retention bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash   bytea  := sha256(p_key);
    v_now    bigint := decision_now(p_now);
    v_log    bigint[];
    v_exp    bigint;
    v_found  boolean;
    v_n      integer;
    v_i      integer;
    v_t      bigint;
    v_count  bigint;
BEGIN
    LOOP
        SELECT s.log, s.expires_at INTO v_log, v_exp
        FROM sliding_log s WHERE s.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        IF NOT v_found THEN
            v_log := '{}';
        END IF;
        v_n := coalesce(array_length(v_log, 1), 0);
        -- A clock that went backwards is clamped to the newest entry.
        v_t := greatest(v_now, CASE WHEN v_n > 0 THEN v_log[v_n] ELSE 0 END);
        v_i := 1;
        WHILE v_i <= v_n AND v_log[v_i] + p_window <= v_t LOOP
            v_i := v_i + 1;
        END LOOP;
        v_count := v_n - v_i + 1;
        IF v_count + p_cost <= p_limit THEN
            v_log := v_log[v_i:v_n] || array_fill(v_t, ARRAY[p_cost::integer]);
            allowed := true;
            remaining := p_limit - v_count - p_cost;
            reset_after_us := greatest(v_t + p_window - v_now, 0);
            retry_after_us := 0;
            IF v_found THEN
                UPDATE sliding_log
                SET log = v_log, expires_at = greatest(v_exp, gc_at(v_t + p_window, p_slack))
                WHERE key_hash = v_hash;
            ELSE
                INSERT INTO sliding_log (key_hash, log, expires_at)
                VALUES (v_hash, v_log, gc_at(v_t + p_window, p_slack))
                ON CONFLICT (key_hash) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
            END IF;
        ELSE
            allowed := false;
            remaining := greatest(p_limit - v_count, 0);
            -- The (count + cost - limit)-th oldest live entry must expire first.
            reset_after_us := greatest(v_log[v_n] + p_window - v_now, 0);
            retry_after_us := greatest(
                v_log[v_i + (v_count + p_cost - p_limit - 1)::integer] + p_window - v_now, 0);
            -- The refusal is not recorded, but entries that have expired are
            -- dropped, as the core algorithm drops them: otherwise a clock
            -- that later goes backwards would find them alive again and
            -- decide more strictly than the core does.
            IF v_i > 1 THEN
                UPDATE sliding_log SET log = v_log[v_i:v_n] WHERE key_hash = v_hash;
            END IF;
            PERFORM record_refusal(v_hash, 'sliding_log', p_limit, p_window, p_cost, v_now,
                                   p_abuse_retention);
        END IF;
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION decide_fixed_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint, p_abuse_retention bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash   bytea  := sha256(p_key);
    v_now    bigint := decision_now(p_now);
    v_start  bigint;
    v_count  bigint;
    v_exp    bigint;
    v_found  boolean;
    v_end    bigint;
BEGIN
    LOOP
        SELECT f.start_us, f.count, f.expires_at INTO v_start, v_count, v_exp
        FROM fixed_window f WHERE f.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        -- A clock behind `start` stays inside the open window.
        IF NOT v_found OR v_now >= v_start + p_window THEN
            v_start := v_now;
            v_count := 0;
        END IF;
        v_end := v_start + p_window;
        IF v_count + p_cost <= p_limit THEN
            allowed := true;
            remaining := p_limit - v_count - p_cost;
            reset_after_us := greatest(v_end - v_now, 0);
            retry_after_us := 0;
            IF v_found THEN
                UPDATE fixed_window
                SET start_us = v_start, count = v_count + p_cost,
                    expires_at = greatest(v_exp, gc_at(v_end, p_slack))
                WHERE key_hash = v_hash;
            ELSE
                INSERT INTO fixed_window (key_hash, start_us, count, expires_at)
                VALUES (v_hash, v_start, v_count + p_cost, gc_at(v_end, p_slack))
                ON CONFLICT (key_hash) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
            END IF;
        ELSE
            allowed := false;
            remaining := greatest(p_limit - v_count, 0);
            reset_after_us := greatest(v_end - v_now, 0);
            retry_after_us := greatest(v_end - v_now, 0);
            PERFORM record_refusal(v_hash, 'fixed_window', p_limit, p_window, p_cost, v_now,
                                   p_abuse_retention);
        END IF;
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION decide_sliding_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint, p_abuse_retention bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash     bytea  := sha256(p_key);
    v_now      bigint := decision_now(p_now);
    v_aligned  bigint;
    v_row_start bigint;
    v_row_cur  bigint;
    v_row_prev bigint;
    v_exp      bigint;
    v_found    boolean;
    v_start    bigint;
    v_cur      bigint;
    v_prev     bigint;
    v_t        bigint;
    v_elapsed  bigint;
    v_weighted bigint;
    v_end_cur  bigint;
    v_reset_at bigint;
    v_retry_at bigint;
    v_e        bigint;
    w          bigint := p_window;
    l          bigint := p_limit;
    c          bigint := p_cost;
BEGIN
    v_aligned := v_now - v_now % w;
    LOOP
        SELECT s.start_us, s.current_count, s.previous_count, s.expires_at
        INTO v_row_start, v_row_cur, v_row_prev, v_exp
        FROM sliding_window s WHERE s.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        IF v_found AND v_row_start >= v_aligned THEN
            -- A clock behind the stored window is clamped to its start.
            v_start := v_row_start; v_cur := v_row_cur; v_prev := v_row_prev;
        ELSIF v_found AND v_row_start + w = v_aligned THEN
            v_start := v_aligned; v_cur := 0; v_prev := v_row_cur;
        ELSE
            v_start := v_aligned; v_cur := 0; v_prev := 0;
        END IF;
        v_t := greatest(v_now, v_start);
        v_elapsed := v_t - v_start;
        v_weighted := v_prev * (w - v_elapsed);
        allowed := v_weighted + (v_cur + c) * w <= l * w;
        IF allowed THEN
            v_cur := v_cur + c;
        END IF;
        remaining := greatest(l * w - (v_weighted + v_cur * w), 0) / w;
        v_end_cur := v_start + w;
        IF v_cur > 0 THEN
            v_reset_at := v_end_cur + w;
        ELSIF v_prev > 0 THEN
            v_reset_at := v_end_cur;
        ELSE
            v_reset_at := v_t;
        END IF;
        IF allowed THEN
            v_retry_at := v_now;
        ELSE
            v_retry_at := NULL;
            -- Later in this window, as the previous window's weight decays.
            IF v_prev > 0 AND v_cur + c <= l THEN
                v_e := w - least((l - v_cur - c) * w / v_prev, w);
                IF v_e < w THEN
                    v_retry_at := v_start + greatest(v_e, v_elapsed);
                END IF;
            END IF;
            -- In the next window, the current count becomes the previous one.
            IF v_retry_at IS NULL THEN
                IF v_cur = 0 THEN
                    v_e := 0;
                ELSE
                    v_e := w - least((l - c) * w / v_cur, w);
                END IF;
                v_retry_at := v_start + w + v_e;
            END IF;
        END IF;
        reset_after_us := greatest(v_reset_at - v_now, 0);
        retry_after_us := greatest(v_retry_at - v_now, 0);
        IF allowed THEN
            IF v_found THEN
                UPDATE sliding_window
                SET start_us = v_start, current_count = v_cur, previous_count = v_prev,
                    expires_at = greatest(v_exp, gc_at(v_start + 2 * w, p_slack))
                WHERE key_hash = v_hash;
            ELSE
                INSERT INTO sliding_window (key_hash, start_us, current_count, previous_count, expires_at)
                VALUES (v_hash, v_start, v_cur, v_prev, gc_at(v_start + 2 * w, p_slack))
                ON CONFLICT (key_hash) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
            END IF;
        ELSE
            PERFORM record_refusal(v_hash, 'sliding_window', l, w, c, v_now, p_abuse_retention);
        END IF;
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION decide_gcra(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint, p_abuse_retention bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash    bytea  := sha256(p_key);
    v_now     bigint := decision_now(p_now);
    -- The emission interval, rounded down as in Policy::emission_interval_micros.
    v_t       bigint := p_window / p_limit;
    v_burst   bigint := p_limit * (p_window / p_limit);
    v_tat     bigint;
    v_new_tat bigint;
    v_exp     bigint;
    v_found   boolean;
BEGIN
    LOOP
        SELECT g.tat, g.expires_at INTO v_tat, v_exp
        FROM gcra g WHERE g.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        v_tat := CASE WHEN v_found THEN greatest(v_tat, v_now) ELSE v_now END;
        v_new_tat := v_tat + p_cost * v_t;
        IF v_new_tat - v_now <= v_burst THEN
            allowed := true;
            remaining := (v_burst - (v_new_tat - v_now)) / v_t;
            reset_after_us := v_new_tat - v_now;
            retry_after_us := 0;
            IF v_found THEN
                UPDATE gcra
                SET tat = v_new_tat, expires_at = greatest(v_exp, gc_at(v_new_tat, p_slack))
                WHERE key_hash = v_hash;
            ELSE
                INSERT INTO gcra (key_hash, tat, expires_at)
                VALUES (v_hash, v_new_tat, gc_at(v_new_tat, p_slack))
                ON CONFLICT (key_hash) DO NOTHING;
                CONTINUE WHEN NOT FOUND;
            END IF;
        ELSE
            allowed := false;
            remaining := greatest(v_burst - (v_tat - v_now), 0) / v_t;
            reset_after_us := v_tat - v_now;
            retry_after_us := v_new_tat - v_burst - v_now;
            PERFORM record_refusal(v_hash, 'gcra', p_limit, p_window, p_cost, v_now,
                                   p_abuse_retention);
        END IF;
        RETURN;
    END LOOP;
END;
$$;
