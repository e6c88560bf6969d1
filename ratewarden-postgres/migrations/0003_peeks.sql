-- ratewarden-postgres schema, version 3: peeks.
--
-- Run like 0001, with search_path set to the store's schema; 0001 and 0002
-- are never edited.
--
-- peek_<algorithm> answers the decision decide_<algorithm> would make now,
-- and leaves nothing behind: it runs decide_<algorithm> itself inside a
-- block that then raises, and a plpgsql block with an exception handler is
-- a subtransaction, so its writes are rolled back while the answer, held in
-- the function's variables, is kept. One code path for both, so a peek
-- cannot drift from a decision. The key's row lock is held for the block
-- only, so a peek waits for a concurrent decision on the key and sees its
-- result; a peek records no abuse event (the retention passed is NULL). The
-- rolled-back write leaves a dead row version for autovacuum, as any update
-- does.
--
-- Arguments: key, limit, window (us), cost, now (us, NULL = server clock),
-- GC slack (us, > 0).

CREATE FUNCTION peek_sliding_log(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    BEGIN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_sliding_log(p_key, p_limit, p_window, p_cost, p_now, p_slack, NULL) d;
        RAISE EXCEPTION 'peek: undo the decision' USING ERRCODE = 'RWPK0';
    EXCEPTION WHEN SQLSTATE 'RWPK0' THEN
        NULL;
    END;
END;
$$;

CREATE FUNCTION peek_fixed_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    BEGIN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_fixed_window(p_key, p_limit, p_window, p_cost, p_now, p_slack, NULL) d;
        RAISE EXCEPTION 'peek: undo the decision' USING ERRCODE = 'RWPK0';
    EXCEPTION WHEN SQLSTATE 'RWPK0' THEN
        NULL;
    END;
END;
$$;

CREATE FUNCTION peek_sliding_window(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    BEGIN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_sliding_window(p_key, p_limit, p_window, p_cost, p_now, p_slack, NULL) d;
        RAISE EXCEPTION 'peek: undo the decision' USING ERRCODE = 'RWPK0';
    EXCEPTION WHEN SQLSTATE 'RWPK0' THEN
        NULL;
    END;
END;
$$;

CREATE FUNCTION peek_gcra(
    p_key bytea, p_limit bigint, p_window bigint, p_cost bigint,
    p_now bigint, p_slack bigint,
    OUT allowed boolean, OUT remaining bigint,
    OUT reset_after_us bigint, OUT retry_after_us bigint
)
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
BEGIN
    BEGIN
        SELECT d.allowed, d.remaining, d.reset_after_us, d.retry_after_us
        INTO allowed, remaining, reset_after_us, retry_after_us
        FROM decide_gcra(p_key, p_limit, p_window, p_cost, p_now, p_slack, NULL) d;
        RAISE EXCEPTION 'peek: undo the decision' USING ERRCODE = 'RWPK0';
    EXCEPTION WHEN SQLSTATE 'RWPK0' THEN
        NULL;
    END;
END;
$$;
