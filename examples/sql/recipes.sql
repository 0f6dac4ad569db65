-- Three recipes for teams whose API layer is the database itself (PostgREST and the like):
-- a role may insert at most 2 posts an hour. Run as a superuser or the tables' owner.

SELECT rate_limiter.define('posts', 'token bucket', 2, '1 hour');
SELECT rate_limiter.define('comments', 'token bucket', 2, '1 hour');

-- 1. Row-level security: the INSERT policy takes a token per row, and a row over the limit
--    fails the policy's check (42501, "new row violates row-level security policy").
CREATE TABLE posts (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    author text NOT NULL DEFAULT current_user,
    body text NOT NULL
);
ALTER TABLE posts ENABLE ROW LEVEL SECURITY;
CREATE POLICY posts_read ON posts FOR SELECT USING (true);
CREATE POLICY posts_rate_limited ON posts FOR INSERT
    WITH CHECK (author = current_user AND (rate_limiter.rate_limit('posts', current_user)).ok);

-- 2. A trigger: BEFORE INSERT takes a token and raises RL429 (with retryAfter in its
--    DETAIL) when there is none, so the client sees why and when to come back.
CREATE TABLE comments (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    author text NOT NULL DEFAULT current_user,
    body text NOT NULL
);
CREATE FUNCTION comments_rate_limited() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM rate_limiter.rate_limit('comments', NEW.author, throws => true);
    RETURN NEW;
END $$;
CREATE TRIGGER comments_rate_limited BEFORE INSERT ON comments
    FOR EACH ROW EXECUTE FUNCTION comments_rate_limited();

-- 3. A write limit, declared once: every statement that writes messages, whatever sends it
--    (the API, a job, COPY), is charged per author in one call, all or nothing, and one over
--    the limit fails whole with RL429. No function of the application's, and no grant of
--    the extension to the writing role.
SELECT rate_limiter.define('messages', 'fixed window', 2, '1 hour');
CREATE TABLE messages (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    author text NOT NULL DEFAULT current_user,
    body text NOT NULL
);
SELECT rate_limiter.limit_writes('messages', 'messages', key => 'author');

-- What the application role needs: its tables, and for recipes 1 and 2 EXECUTE on
-- rate_limit (the policy and the trigger function run as the inserting role).
CREATE ROLE app_user LOGIN;
GRANT SELECT, INSERT ON posts, comments, messages TO app_user;
GRANT USAGE ON SCHEMA rate_limiter TO app_user;
GRANT EXECUTE ON FUNCTION rate_limiter.rate_limit TO app_user;
