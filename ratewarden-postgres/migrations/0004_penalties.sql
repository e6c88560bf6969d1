-- ratewarden-postgres schema, version 4: penalties.
--
-- Run like 0001, with search_path set to the store's schema; 0001 to 0003
-- are never edited.
--
-- penalize_<algorithm> records p_cost units for the key at now whether or
-- not they fit, within the same bounds: a transcription of
-- ratewarden_core::algorithm::penalize. The key's state is read and written
-- under its row lock, as decide_<algorithm> does (a new key is inserted, and
-- the insert retried as an update if a concurrent one won). Nothing is
-- refused, so no abuse event is recorded.
--
-- Arguments: key, limit, window (us), cost, now (us, NULL = server clock),
-- GC slack (us, > 0).

CREATE FUNCTION penalize_sliding_log(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash  bytea  := sha256(p_key);
    v_now   bigint := decision_now(p_now);
    v_log   bigint[];
    v_exp   bigint;
    v_found boolean;
    v_n     integer;
    v_i     integer;
    v_t     bigint;
BEGIN
    LOOP
        SELECT s.log, s.expires_at INTO v_log, v_exp
        FROM sliding_log s WHERE s.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        IF NOT v_found THEN
            v_log := '{}';
        END IF;
        v_n := coalesce(array_length(v_log, 1), 0);
        v_t := greatest(v_now, CASE WHEN v_n > 0 THEN v_log[v_n] ELSE 0 END);
        v_i := 1;
        WHILE v_i <= v_n AND v_log[v_i] + p_window <= v_t LOOP
            v_i := v_i + 1;
        END LOOP;
        v_log := v_log[v_i:v_n] || array_fill(v_t, ARRAY[p_cost::integer]);
        -- What does not fit replaces the oldest entries.
        v_n := array_length(v_log, 1);
        IF v_n > p_limit THEN
            v_log := v_log[v_n - p_limit::integer + 1:v_n];
        END IF;
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
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION penalize_fixed_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash  bytea  := sha256(p_key);
    v_now   bigint := decision_now(p_now);
    v_start bigint;
    v_count bigint;
    v_exp   bigint;
    v_found boolean;
BEGIN
    LOOP
        SELECT f.start_us, f.count, f.expires_at INTO v_start, v_count, v_exp
        FROM fixed_window f WHERE f.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        IF NOT v_found OR v_now >= v_start + p_window THEN
            v_start := v_now;
            v_count := 0;
        END IF;
        v_count := greatest(v_count, least(v_count + p_cost, p_limit));
        IF v_found THEN
            UPDATE fixed_window
            SET start_us = v_start, count = v_count,
                expires_at = greatest(v_exp, gc_at(v_start + p_window, p_slack))
            WHERE key_hash = v_hash;
        ELSE
            INSERT INTO fixed_window (key_hash, start_us, count, expires_at)
            VALUES (v_hash, v_start, v_count, gc_at(v_start + p_window, p_slack))
            ON CONFLICT (key_hash) DO NOTHING;
            CONTINUE WHEN NOT FOUND;
        END IF;
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION penalize_sliding_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash      bytea  := sha256(p_key);
    v_now       bigint := decision_now(p_now);
    v_aligned   bigint;
    v_row_start bigint;
    v_row_cur   bigint;
    v_row_prev  bigint;
    v_exp       bigint;
    v_found     boolean;
    v_start     bigint;
    v_cur       bigint;
    v_prev      bigint;
    w           bigint := p_window;
BEGIN
    v_aligned := v_now - v_now % w;
    LOOP
        SELECT s.start_us, s.current_count, s.previous_count, s.expires_at
        INTO v_row_start, v_row_cur, v_row_prev, v_exp
        FROM sliding_window s WHERE s.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        IF v_found AND v_row_start >= v_aligned THEN
            v_start := v_row_start; v_cur := v_row_cur; v_prev := v_row_prev;
        ELSIF v_found AND v_row_start + w = v_aligned THEN
            v_start := v_aligned; v_cur := 0; v_prev := v_row_cur;
        ELSE
            v_start := v_aligned; v_cur := 0; v_prev := 0;
        END IF;
        v_cur := greatest(v_cur, least(v_cur + p_cost, p_limit));
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
        RETURN;
    END LOOP;
END;
$$;

CREATE FUNCTION penalize_gcra(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint
) RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash  bytea  := sha256(p_key);
    v_now   bigint := decision_now(p_now);
    -- As in decide_gcra.
    v_t     bigint := p_window / p_limit;
    v_burst bigint := p_limit * (p_window / p_limit);
    v_tat   bigint;
    v_exp   bigint;
    v_found boolean;
BEGIN
    LOOP
        SELECT g.tat, g.expires_at INTO v_tat, v_exp
        FROM gcra g WHERE g.key_hash = v_hash FOR UPDATE;
        v_found := FOUND;
        v_tat := CASE WHEN v_found THEN greatest(v_tat, v_now) ELSE v_now END;
        -- A full bucket and one window more, less one unit: a wait of at
        -- most the window.
        v_tat := greatest(v_tat, least(v_tat + p_cost * v_t, v_now + v_burst + p_window - v_t));
        IF v_found THEN
            UPDATE gcra
            SET tat = v_tat, expires_at = greatest(v_exp, gc_at(v_tat, p_slack))
            WHERE key_hash = v_hash;
        ELSE
            INSERT INTO gcra (key_hash, tat, expires_at)
            VALUES (v_hash, v_tat, gc_at(v_tat, p_slack))
            ON CONFLICT (key_hash) DO NOTHING;
            CONTINUE WHEN NOT FOUND;
        END IF;
        RETURN;
    END LOOP;
END;
$$;
