-- ratewarden-postgres schema, version 2: refunds, counted abuse events, and
-- at most one recorded refusal per key and window.
--
-- Run like 0001, with search_path set to the store's schema. 0001 is never
-- edited: schemas at version 1 are deployed, and this migration brings them
-- here in place, keeping their state and their abuse events.

-- An abuse event may stand for many refusals (a Limiter's sink aggregates
-- them), from `since_us` to `at_us`. Rows written before version 2 stood
-- for one refusal each, which the default says; their NULL `since_us`
-- reads as `at_us`.
ALTER TABLE abuse_events
    ADD COLUMN refusals bigint NOT NULL DEFAULT 1,
    ADD COLUMN since_us bigint;

-- Called by every decide_* function on a refusal when refusals are
-- recorded. Version 1 inserted a row per refusal, so a flood of N refusals
-- was N writes, the load a limiter exists to shed. Now a row is inserted
-- only when the key has none for the same policy within the last window: a
-- lookup on abuse_events_key_hash (key_hash, at_us), and no write at all
-- while a flood lasts. A row therefore means "refused at least once in the
-- window from at_us"; counts come from a Limiter's abuse sink.
--
-- Two refusals of one key cannot both miss each other's row: a refusal
-- always holds the lock on the key's state row (a key without state cannot
-- be refused), so they run one after the other, and the second statement
-- of a READ COMMITTED function sees what the first committed.
CREATE OR REPLACE FUNCTION record_refusal(
    p_hash bytea, p_algorithm text, p_limit bigint, p_window bigint,
    p_cost bigint, p_now bigint, p_retention bigint
) RETURNS void
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
BEGIN ATOMIC
    INSERT INTO abuse_events
        (key_hash, algorithm, limit_units, window_us, cost, at_us, since_us, expires_at)
    SELECT p_hash, p_algorithm, p_limit, p_window, p_cost, p_now, p_now, p_now + p_retention
    WHERE p_retention IS NOT NULL
      AND NOT EXISTS (
          SELECT 1 FROM abuse_events e
          WHERE e.key_hash = p_hash
            AND e.at_us > p_now - p_window
            AND e.algorithm = p_algorithm
            AND e.limit_units = p_limit
            AND e.window_us = p_window);
END;

-- Each refund_* function transcribes ratewarden_core::algorithm::refund: it
-- gives back the units one admission wrote, located by the anchor
-- a = now + reset_after of that admission, or nothing when the key no
-- longer holds them as written. It is called as one statement per refund,
-- locks the key's row like the decide functions (an UPDATE's WHERE is
-- re-checked on the newest row version after waiting for the lock), never
-- creates a row, and never moves `expires_at`: expiry belongs to the
-- admission that opened the state.
--
-- Arguments: key, limit, window (µs), cost, anchor (µs).
-- Returns whether units were given back.

-- Sliding log: the admission appended `cost` entries equal to a − W; the
-- log is sorted, so they are one run, and up to `cost` of them go.
CREATE FUNCTION refund_sliding_log(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint, p_anchor bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash bytea  := sha256(p_key);
    v_t    bigint := p_anchor - p_window;
    v_log  bigint[];
    v_n    integer;
    v_i    integer;
    v_j    integer;
    v_k    integer;
BEGIN
    SELECT s.log INTO v_log
    FROM sliding_log s WHERE s.key_hash = v_hash FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    v_n := coalesce(array_length(v_log, 1), 0);
    -- The run of entries equal to t is [v_i, v_j).
    v_i := 1;
    WHILE v_i <= v_n AND v_log[v_i] < v_t LOOP
        v_i := v_i + 1;
    END LOOP;
    v_j := v_i;
    WHILE v_j <= v_n AND v_log[v_j] = v_t LOOP
        v_j := v_j + 1;
    END LOOP;
    v_k := least(v_j - v_i, p_cost)::integer;
    IF v_k = 0 THEN
        RETURN false;
    END IF;
    v_log := v_log[1:v_j - v_k - 1] || v_log[v_j:v_n];
    IF cardinality(v_log) = 0 THEN
        -- Equivalent to no state; a decision waiting on the lock finds no
        -- row and creates one, as for a key never seen.
        DELETE FROM sliding_log WHERE key_hash = v_hash;
    ELSE
        UPDATE sliding_log SET log = v_log WHERE key_hash = v_hash;
    END IF;
    RETURN true;
END;
$$;

-- Fixed window: only the window that opened at a − W holds the units; a
-- later window never gives them back.
CREATE FUNCTION refund_fixed_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint, p_anchor bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    UPDATE fixed_window f
    SET count = f.count - least(p_cost, f.count)
    WHERE f.key_hash = sha256(p_key)
      AND f.start_us = p_anchor - p_window
      AND f.count > 0;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    -- A window holding nothing was opened by refunded requests only:
    -- without them it would open at the next admission, not end early.
    DELETE FROM fixed_window f WHERE f.key_hash = sha256(p_key) AND f.count = 0;
    RETURN true;
END;
$$;

-- Sliding window: the admission counted in the window starting at
-- s = a − 2W; its units are `current` while that window is the stored one
-- and `previous` after one roll-over. Any other window never held them.
CREATE FUNCTION refund_sliding_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint, p_anchor bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_s bigint := p_anchor - 2 * p_window;
BEGIN
    UPDATE sliding_window w
    SET current_count = CASE WHEN w.start_us = v_s
                             THEN w.current_count - least(p_cost, w.current_count)
                             ELSE w.current_count END,
        previous_count = CASE WHEN w.start_us = v_s + p_window
                              THEN w.previous_count - least(p_cost, w.previous_count)
                              ELSE w.previous_count END
    WHERE w.key_hash = sha256(p_key)
      AND ((w.start_us = v_s AND w.current_count > 0)
           OR (w.start_us = v_s + p_window AND w.previous_count > 0));
    RETURN FOUND;
END;
$$;

-- GCRA: only while the arrival time is still the one the admission set. A
-- later admission may have restarted the bucket from its own `now`,
-- absorbing these units; subtracting then would hand out free ones.
CREATE FUNCTION refund_gcra(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint, p_anchor bigint
) RETURNS boolean
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    -- The emission interval, rounded down as in decide_gcra.
    UPDATE gcra g
    SET tat = g.tat - p_cost * (p_window / p_limit)
    WHERE g.key_hash = sha256(p_key)
      AND g.tat = p_anchor;
    RETURN FOUND;
END;
$$;
