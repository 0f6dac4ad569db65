-- rate_limiter 0.4.0 -> 0.5.0: a hot (name, key)'s debits found by their own index, so that
-- loading its escrow or folding its log reads only its rows, however long the log is; ip_key
-- keys an IPv6 address that carries a client's IPv4 address (NAT64, 6to4, Teredo) as that
-- IPv4 address, as it already did IPv4-mapped ones; the state of each inline config is kept
-- in a row of its own, and the sliding window keeps the tokens both its windows took.
-- Run ALTER EXTENSION rate_limiter UPDATE after installing the library: until then, hot
-- calls in this database get SQLSTATE 55000 with that hint.
--
-- Runs as a superuser with search_path = rate_limiter; ip_key pins its own search_path and
-- qualifies every operator and function it names.

CREATE INDEX debits_key ON rate_limiter.debits (name, key, seq);
COMMENT ON INDEX rate_limiter.debits_key IS
    'A hot (name, key)''s debits in seq order: what loading its escrow and folding read.';

-- The rows 0.4.0 wrote stay as they are: the library reads an inline config's old row as the
-- state its own row starts from, and a sliding window's one count as the previous window's.
COMMENT ON COLUMN rate_limiter.state.name IS
    'The limit''s name; for an inline config, the name, ''#'' and 32 hex digits of the config''s fingerprint: each inline config keeps a state of its own.';
COMMENT ON COLUMN rate_limiter.state.counts IS
    'Sliding window: {tokens taken in the window before ts, tokens taken in the window from ts} (a row 0.4.0 wrote holds the first only). Rolling window: tokens taken per counting cell, oldest first, the last starting at ts. NULL for the other kinds.';

CREATE OR REPLACE FUNCTION rate_limiter.ip_key(addr inet, v4_prefix integer DEFAULT 32, v6_prefix integer DEFAULT 56)
RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path TO pg_catalog, pg_temp
AS $function$
DECLARE
    address inet := pg_catalog.set_masklen(addr, CASE pg_catalog.family(addr) WHEN 4 THEN 32 ELSE 128 END);
    v4_at integer;
    v4 bit(32);
BEGIN
    IF v4_prefix OPERATOR(pg_catalog.<) 0 OR v4_prefix OPERATOR(pg_catalog.>) 32 THEN
        RAISE EXCEPTION 'rate_limiter: v4_prefix must be between 0 and 32, not %', v4_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '32 keys each IPv4 address on its own; 24 keys its /24.';
    END IF;
    IF v6_prefix OPERATOR(pg_catalog.<) 0 OR v6_prefix OPERATOR(pg_catalog.>) 128 THEN
        RAISE EXCEPTION 'rate_limiter: v6_prefix must be between 0 and 128, not %', v6_prefix
            USING ERRCODE = 'invalid_parameter_value', HINT = '56 (the default) keys a typical customer''s whole IPv6 allocation; 64 keys one subnet.';
    END IF;
    -- Where the IPv4 address starts among the IPv6 address's 16 bytes.
    v4_at := CASE
        WHEN address OPERATOR(pg_catalog.<<=) '::ffff:0.0.0.0/96'::inet THEN 12
        WHEN address OPERATOR(pg_catalog.<<=) '64:ff9b::/96'::inet THEN 12
        WHEN address OPERATOR(pg_catalog.<<=) '2002::/16'::inet THEN 2
        WHEN address OPERATOR(pg_catalog.<<=) '2001::/32'::inet THEN 12
    END;
    IF v4_at IS NOT NULL THEN
        v4 := CAST('x' OPERATOR(pg_catalog.||) pg_catalog.encode(
            pg_catalog.substring(pg_catalog.inet_send(address), 5 OPERATOR(pg_catalog.+) v4_at, 4), 'hex') AS bit(32));
        IF address OPERATOR(pg_catalog.<<=) '2001::/32'::inet THEN
            v4 := OPERATOR(pg_catalog.~) v4;
        END IF;
        address := '0.0.0.0'::inet OPERATOR(pg_catalog.+) CAST(v4 AS bigint);
    END IF;
    RETURN pg_catalog.network(pg_catalog.set_masklen(address,
        CASE pg_catalog.family(address) WHEN 4 THEN v4_prefix ELSE v6_prefix END))::text;
END
$function$;
COMMENT ON FUNCTION rate_limiter.ip_key(inet, integer, integer) IS
    'A rate-limit key for a client address: an IPv6 address carrying an IPv4 one (mapped, NAT64 64:ff9b::/96, 6to4, Teredo) as that IPv4 address, IPv4 masked to v4_prefix, IPv6 to v6_prefix, as cidr text.';
