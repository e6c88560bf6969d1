-- ratewarden-postgres schema, version 5: bans.
--
-- Run like 0001, with search_path set to the store's schema; 0001 to 0004
-- are never edited.
--
-- A policy's ban (ratewarden_core::ban, transcribed here): one row per
-- (key, algorithm), beside the algorithm's state row, created by the key's
-- first refusal under a banning policy. decide_banned and peek_banned wrap
-- the algorithm's decide_* and peek_* in the same statement, so a ban costs
-- no round trip of its own.
--
-- Every write of a ban row is made holding the key's state row lock (a
-- refusal needs a state row, and decide_banned takes that lock before it
-- reads the ban), so the ban a decision reads is the committed one.

CREATE TABLE bans (
    key_hash   bytea   NOT NULL,
    algorithm  text    NOT NULL,
    -- Banned until then (0: never, or forgiven).
    until_us   bigint  NOT NULL,
    -- Bans given so far, at most 64.
    offences   integer NOT NULL,
    -- The breach window's start, and the refusals counted in it.
    start_us   bigint  NOT NULL,
    breaches   integer NOT NULL,
    expires_at bigint  NOT NULL,
    PRIMARY KEY (key_hash, algorithm)
) WITH (fillfactor = 70);
CREATE INDEX bans_expires_at ON bans (expires_at);

-- min(block × factor^offences, max), multiplied step by step as
-- Ban::length_micros does (a value under max times a factor of at most
-- 1000 stays far inside a bigint).
CREATE FUNCTION ban_length(
    p_block bigint, p_factor bigint, p_max bigint, p_offences integer
) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
AS $$
DECLARE
    v_length bigint  := p_block;
    v_i      integer := 0;
BEGIN
    WHILE v_i < p_offences AND p_factor > 1 AND v_length < p_max LOOP
        v_length := v_length * p_factor;
        v_i := v_i + 1;
    END LOOP;
    RETURN least(v_length, p_max);
END;
$$;

-- Arguments: the algorithm (its table's name), then decide_*'s (key, limit,
-- window, cost, now, GC slack, abuse-event retention), then the ban's
-- (refusals that ban, their window, the first ban, the growth factor, the
-- longest ban; times in µs). `banned` is true for a ban's refusal.
CREATE FUNCTION decide_banned(
    p_algorithm text, p_key bytea, p_limit bigint, p_window bigint,
    p_cost bigint, p_now bigint, p_slack bigint, p_abuse_retention bigint,
    p_after bigint, p_within bigint, p_block bigint, p_factor bigint,
    p_max bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint, OUT banned boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_hash     bytea  := sha256(p_key);
    v_now      bigint := decision_now(p_now);
    v_found    boolean;
    v_until    bigint;
    v_offences integer;
    v_start    bigint;
    v_breaches integer;
    v_length   bigint;
    v_exp      bigint;
BEGIN
    IF p_algorithm = 'sliding_log' THEN
        PERFORM 1 FROM sliding_log s WHERE s.key_hash = v_hash FOR UPDATE;
    ELSIF p_algorithm = 'fixed_window' THEN
        PERFORM 1 FROM fixed_window f WHERE f.key_hash = v_hash FOR UPDATE;
    ELSIF p_algorithm = 'sliding_window' THEN
        PERFORM 1 FROM sliding_window w WHERE w.key_hash = v_hash FOR UPDATE;
    ELSIF p_algorithm = 'gcra' THEN
        PERFORM 1 FROM gcra g WHERE g.key_hash = v_hash FOR UPDATE;
    ELSE
        RAISE EXCEPTION 'decide_banned: unknown algorithm %', p_algorithm;
    END IF;
    SELECT b.until_us, b.offences, b.start_us, b.breaches
    INTO v_until, v_offences, v_start, v_breaches
    FROM bans b WHERE b.key_hash = v_hash AND b.algorithm = p_algorithm;
    v_found := FOUND;
    -- Banned: refused, and nothing written, so a ban never extends itself.
    IF v_found AND v_now < v_until THEN
        allowed := false;
        remaining := 0;
        reset_after_us := v_until - v_now;
        retry_after_us := v_until - v_now;
        banned := true;
        RETURN;
    END IF;
    banned := false;
    IF p_algorithm = 'sliding_log' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_sliding_log(p_key, p_limit, p_window, p_cost, v_now, p_slack,
                                p_abuse_retention) d;
    ELSIF p_algorithm = 'fixed_window' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_fixed_window(p_key, p_limit, p_window, p_cost, v_now, p_slack,
                                 p_abuse_retention) d;
    ELSIF p_algorithm = 'sliding_window' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_sliding_window(p_key, p_limit, p_window, p_cost, v_now, p_slack,
                                   p_abuse_retention) d;
    ELSE
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_gcra(p_key, p_limit, p_window, p_cost, v_now, p_slack,
                         p_abuse_retention) d;
    END IF;
    IF allowed THEN
        RETURN;
    END IF;
    -- A refusal is a breach.
    IF NOT v_found THEN
        v_until := 0;
        v_offences := 0;
        v_start := 0;
        v_breaches := 0;
    END IF;
    IF (v_offences > 0 OR v_until > 0) AND v_now >= v_until + p_max THEN
        v_offences := 0;
        v_until := 0;
    END IF;
    IF v_breaches > 0 AND v_now >= v_start + p_within THEN
        v_breaches := 0;
    END IF;
    IF v_breaches = 0 THEN
        v_start := v_now;
    END IF;
    v_breaches := v_breaches + 1;
    IF v_breaches >= p_after THEN
        v_length := ban_length(p_block, p_factor, p_max, v_offences);
        v_until := v_now + v_length;
        v_offences := least(v_offences + 1, 64);
        v_breaches := 0;
        remaining := 0;
        reset_after_us := v_length;
        retry_after_us := v_length;
        banned := true;
    END IF;
    v_exp := 0;
    IF v_breaches > 0 THEN
        v_exp := v_start + p_within;
    END IF;
    IF v_offences > 0 OR v_until > 0 THEN
        v_exp := greatest(v_exp, v_until + p_max);
    END IF;
    INSERT INTO bans (key_hash, algorithm, until_us, offences, start_us, breaches, expires_at)
    VALUES (v_hash, p_algorithm, v_until, v_offences, v_start, v_breaches,
            gc_at(v_exp, p_slack))
    ON CONFLICT (key_hash, algorithm) DO UPDATE
    SET until_us = EXCLUDED.until_us, offences = EXCLUDED.offences,
        start_us = EXCLUDED.start_us, breaches = EXCLUDED.breaches,
        expires_at = EXCLUDED.expires_at;
END;
$$;

-- decide_banned's answer, changing nothing: the ban's refusal while it
-- lasts, else the algorithm's peek_*.
CREATE FUNCTION peek_banned(
    p_algorithm text, p_key bytea, p_limit bigint, p_window bigint,
    p_cost bigint, p_now bigint, p_slack bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint, OUT banned boolean
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint := decision_now(p_now);
    v_until bigint;
BEGIN
    SELECT b.until_us INTO v_until
    FROM bans b WHERE b.key_hash = sha256(p_key) AND b.algorithm = p_algorithm;
    IF FOUND AND v_now < v_until THEN
        allowed := false;
        remaining := 0;
        reset_after_us := v_until - v_now;
        retry_after_us := v_until - v_now;
        banned := true;
        RETURN;
    END IF;
    banned := false;
    IF p_algorithm = 'sliding_log' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM peek_sliding_log(p_key, p_limit, p_window, p_cost, v_now, p_slack) d;
    ELSIF p_algorithm = 'fixed_window' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM peek_fixed_window(p_key, p_limit, p_window, p_cost, v_now, p_slack) d;
    ELSIF p_algorithm = 'sliding_window' THEN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM peek_sliding_window(p_key, p_limit, p_window, p_cost, v_now, p_slack) d;
    ELSE
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM peek_gcra(p_key, p_limit, p_window, p_cost, v_now, p_slack) d;
    END IF;
END;
$$;
