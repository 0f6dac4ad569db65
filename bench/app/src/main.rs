//! The application's own transaction (insert a message, or read the user's row), alone,
//! with a rate limit inside it, and with a Redis token bucket called before it: a closed
//! loop of N connections for a fixed time, latencies in an HdrHistogram, a ledger checked
//! after every run. Variants take turns within each round. Set up and run by
//! bench/app/run.sh; everything comes from the environment (see `Settings`).
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls, Statement};

/// What the request does in its transaction.
#[derive(Clone, Copy, PartialEq)]
enum Work {
    /// Insert a message for the user.
    Write,
    /// Read the user's row by primary key.
    Read,
}

impl Work {
    fn label(self) -> &'static str {
        match self {
            Work::Write => "write",
            Work::Read => "read",
        }
    }

    /// The limits compared on it: a read has no hot key or shards to compare.
    fn limits(self) -> &'static [Limit] {
        match self {
            Work::Write => &Limit::ALL,
            Work::Read => &[Limit::None, Limit::PerUser, Limit::Memory, Limit::RedisAlways, Limit::RedisEverysec],
        }
    }
}

/// What stands between the request and its work.
#[derive(Clone, Copy, PartialEq)]
enum Limit {
    None,
    /// rate_limiter.rate_limit on the user's key (USERS keys).
    PerUser,
    /// The same limit, `durable => false`: counted in shared memory.
    Memory,
    /// rate_limiter.rate_limit on one key of a `hot => true` limit.
    Hot,
    /// rate_limiter.rate_limit on one key of a `shards => 16` limit.
    Sharded,
    /// bench/redis_bucket.lua by EVALSHA on the user's key, before the transaction.
    RedisAlways,
    RedisEverysec,
}

impl Limit {
    const ALL: [Limit; 7] = [
        Limit::None,
        Limit::PerUser,
        Limit::Memory,
        Limit::Hot,
        Limit::Sharded,
        Limit::RedisAlways,
        Limit::RedisEverysec,
    ];

    fn label(self) -> &'static str {
        match self {
            Limit::None => "none",
            Limit::PerUser => "per_user",
            Limit::Memory => "memory",
            Limit::Hot => "hot",
            Limit::Sharded => "sharded",
            Limit::RedisAlways => "redis_always",
            Limit::RedisEverysec => "redis_everysec",
        }
    }

    /// The rate_limiter limit this variant calls (bench/app/schema.sql defines them).
    fn limit_name(self) -> Option<&'static str> {
        match self {
            Limit::PerUser => Some("app_per_user"),
            Limit::Memory => Some("app_memory"),
            Limit::Hot => Some("app_hot"),
            Limit::Sharded => Some("app_sharded"),
            _ => None,
        }
    }

    /// A connection to the Redis this variant calls, if it calls one.
    async fn redis(self, settings: &Settings) -> Option<redis::aio::MultiplexedConnection> {
        let url = match self {
            Limit::RedisAlways => &settings.redis_always,
            Limit::RedisEverysec => &settings.redis_everysec,
            _ => return None,
        };
        let client = redis::Client::open(url.as_str()).expect("APP_REDIS_*");
        Some(client.get_multiplexed_async_connection().await.expect("connect to Redis"))
    }
}

/// How the application talks to Postgres.
#[derive(Clone, Copy, PartialEq)]
enum Form {
    /// BEGIN; [SELECT rate_limit(...)]; INSERT; COMMIT: one round trip each.
    Statements,
    /// One statement in autocommit: the limit and the insert together.
    OneTrip,
}

impl Form {
    fn label(self) -> &'static str {
        match self {
            Form::Statements => "statements",
            Form::OneTrip => "one_trip",
        }
    }
}

struct Settings {
    postgres: String,
    redis_always: String,
    redis_everysec: String,
    redis_sha: String,
    users: u64,
    warmup: Duration,
    duration: Duration,
    rounds: usize,
    clients: Vec<usize>,
    out: String,
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

impl Settings {
    fn from_env() -> Settings {
        let seconds = |name, default| Duration::from_secs_f64(env(name, default).parse().expect(name));
        Settings {
            postgres: env("APP_POSTGRES", "host=/tmp port=5488 user=postgres dbname=rate_limiter_bench_app"),
            redis_always: env("APP_REDIS_ALWAYS", "redis://127.0.0.1:6391/"),
            redis_everysec: env("APP_REDIS_EVERYSEC", "redis://127.0.0.1:6392/"),
            redis_sha: std::env::var("APP_REDIS_SHA").expect("APP_REDIS_SHA: the SHA of bench/redis_bucket.lua"),
            users: env("APP_USERS", "100000").parse().expect("APP_USERS"),
            warmup: seconds("APP_WARMUP", "1"),
            duration: seconds("APP_DURATION", "8"),
            rounds: env("APP_ROUNDS", "3").parse().expect("APP_ROUNDS"),
            clients: env("APP_CLIENTS", "8 32").split_whitespace().map(|c| c.parse().expect("APP_CLIENTS")).collect(),
            out: env("APP_OUT", "bench/out/app"),
        }
    }
}

/// Redis's token bucket: 1 token per 10 years, a capacity no run exhausts, so every call
/// is granted and the tokens used are the calls counted (the limits in schema.sql alike).
const REDIS_RATE_PER_SECOND: &str = "3.168808781402895e-9";
const CAPACITY: f64 = 1e12;

/// One connection's prepared statements for a variant.
struct Session {
    pg: Client,
    redis: Option<redis::aio::MultiplexedConnection>,
    begin: Statement,
    commit: Statement,
    rollback: Statement,
    limit: Statement,
    /// The work alone: the INSERT, or the SELECT of the user's row.
    work: Statement,
    one_trip: Statement,
}

impl Session {
    async fn open(settings: &Settings, work: Work, limit: Limit) -> Session {
        let mut config: tokio_postgres::Config = settings.postgres.parse().expect("APP_POSTGRES");
        config.options("-c synchronous_commit=on");
        let (pg, connection) = config.connect(NoTls).await.expect("connect to Postgres");
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                panic!("Postgres connection: {e}");
            }
        });
        let redis = limit.redis(settings).await;
        let alone = match work {
            Work::Write => "INSERT INTO app.messages (user_id, body) VALUES ($1, $2) RETURNING id",
            Work::Read => "SELECT id, name, plan FROM app.users WHERE id = $1",
        };
        let one_trip = match (work, limit.limit_name()) {
            (Work::Write, Some(_)) => "WITH l AS (SELECT ok FROM rate_limiter.rate_limit($1, $2)) \
                        INSERT INTO app.messages (user_id, body) SELECT $3, $4 FROM l WHERE l.ok RETURNING id",
            (Work::Read, Some(_)) => "SELECT u.id, u.name, u.plan FROM rate_limiter.rate_limit($1, $2) l, app.users u \
                        WHERE l.ok AND u.id = $3",
            (_, None) => alone,
        };
        Session {
            begin: pg.prepare("BEGIN").await.unwrap(),
            commit: pg.prepare("COMMIT").await.unwrap(),
            rollback: pg.prepare("ROLLBACK").await.unwrap(),
            limit: pg.prepare("SELECT ok FROM rate_limiter.rate_limit($1, $2)").await.unwrap(),
            work: pg.prepare(alone).await.unwrap(),
            one_trip: pg.prepare(one_trip).await.unwrap(),
            pg,
            redis,
        }
    }

    /// One request: true when its transaction committed with its work done (the message
    /// inserted, the row read).
    async fn request(&mut self, settings: &Settings, work: Work, limit: Limit, form: Form, user: i64) -> bool {
        const BODY: &str = "hello from the application";
        let key = match limit {
            Limit::Hot | Limit::Sharded => "global".to_string(),
            _ => user.to_string(),
        };
        if let Some(redis) = self.redis.as_mut() {
            let granted: i64 = redis::cmd("EVALSHA")
                .arg(&settings.redis_sha)
                .arg(1)
                .arg(format!("app:{key}"))
                .arg(REDIS_RATE_PER_SECOND)
                .arg(CAPACITY)
                .query_async(redis)
                .await
                .expect("EVALSHA");
            if granted != 1 {
                return false;
            }
        }
        let pg = &self.pg;
        let write = work == Work::Write;
        match (form, limit.limit_name()) {
            (Form::OneTrip, Some(name)) => {
                let rows = if write {
                    pg.query(&self.one_trip, &[&name, &key, &user, &BODY]).await
                } else {
                    pg.query(&self.one_trip, &[&name, &key, &user]).await
                };
                rows.expect("one trip").len() == 1
            }
            (Form::OneTrip, None) => {
                let rows = if write { pg.query(&self.one_trip, &[&user, &BODY]).await } else { pg.query(&self.one_trip, &[&user]).await };
                rows.expect("the work alone").len() == 1
            }
            (Form::Statements, name) => {
                pg.execute(&self.begin, &[]).await.expect("BEGIN");
                if let Some(name) = name {
                    let ok: bool = pg.query_one(&self.limit, &[&name, &key]).await.expect("rate_limit").get(0);
                    if !ok {
                        pg.execute(&self.rollback, &[]).await.expect("ROLLBACK");
                        return false;
                    }
                }
                let done = if write {
                    pg.query(&self.work, &[&user, &BODY]).await
                } else {
                    pg.query(&self.work, &[&user]).await
                };
                let done = done.expect("the work").len() == 1;
                pg.execute(&self.commit, &[]).await.expect("COMMIT");
                done
            }
        }
    }
}

/// What one connection did in one run.
struct Tally {
    latencies: Histogram<u64>,
    measured: u64,
    committed: u64,
    refused: u64,
}

/// A small generator per connection (splitmix64): users drawn uniformly.
struct Users(u64);

impl Users {
    fn next(&mut self, users: u64) -> i64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % users) as i64 + 1
    }
}

fn histogram() -> Histogram<u64> {
    // Microseconds, 1 µs to 100 s, 3 significant digits.
    Histogram::new_with_bounds(1, 100_000_000, 3).unwrap()
}

/// One closed-loop connection: requests from the start until `end`, latencies of those
/// that started after `measure_from`.
async fn connection(
    settings: std::sync::Arc<Settings>,
    mut session: Session,
    work: Work,
    limit: Limit,
    form: Form,
    seed: u64,
    mut start: tokio::sync::watch::Receiver<Option<(Instant, Instant)>>,
) -> Tally {
    let (measure_from, end) = loop {
        if let Some(window) = *start.borrow() {
            break window;
        }
        start.changed().await.expect("the run's start");
    };
    let mut users = Users(seed);
    let mut tally = Tally { latencies: histogram(), measured: 0, committed: 0, refused: 0 };
    loop {
        let began = Instant::now();
        if began >= end {
            break;
        }
        let committed = session.request(&settings, work, limit, form, users.next(settings.users)).await;
        if committed {
            tally.committed += 1;
        } else {
            tally.refused += 1;
        }
        if began >= measure_from {
            tally.latencies.saturating_record(began.elapsed().as_micros() as u64);
            tally.measured += 1;
        }
    }
    tally
}

/// Tokens the variant's limit counts as used, and the messages committed: the ledger's two
/// sides are their changes over a run.
async fn ledger(admin: &Client, redis: &mut Option<redis::aio::MultiplexedConnection>, limit: Limit, users: u64) -> (f64, i64) {
    let messages: i64 = admin.query_one("SELECT count(*) FROM app.messages", &[]).await.unwrap().get(0);
    let used = if limit == Limit::Memory {
        // No row: each user's count as the limit reports it.
        admin
            .query_one(
                "SELECT coalesce(sum(1e12 - v.value), 0)::float8 FROM generate_series(1, $1::bigint) g,
                        rate_limiter.rate_limit_value('app_memory', g::text) v",
                &[&(users as i64)],
            )
            .await
            .unwrap()
            .get(0)
    } else if let Some(name) = limit.limit_name() {
        admin
            .query_one(
                "SELECT coalesce((SELECT sum(l.capacity / l.shards - s.value) FROM rate_limiter.state s
                                  JOIN rate_limiter.limits l USING (name) WHERE name = $1), 0)
                      + coalesce((SELECT sum(count) FROM rate_limiter.debits WHERE name = $1), 0)",
                &[&name],
            )
            .await
            .unwrap()
            .get(0)
    } else if let Some(redis) = redis.as_mut() {
        let total: String = redis::Script::new(
            "local cursor, total = '0', 0
             repeat
               local r = redis.call('SCAN', cursor, 'MATCH', 'app:*', 'COUNT', 1000)
               cursor = r[1]
               for _, k in ipairs(r[2]) do
                 total = total + (tonumber(ARGV[1]) - tonumber(redis.call('HGET', k, 'v')))
               end
             until cursor == '0'
             return tostring(total)",
        )
        .arg(CAPACITY)
        .invoke_async(redis)
        .await
        .expect("Redis ledger");
        total.parse().unwrap()
    } else {
        messages as f64
    };
    (used, messages)
}

struct Run {
    round: usize,
    clients: usize,
    work: Work,
    limit: Limit,
    form: Form,
    latencies: Histogram<u64>,
    rps: f64,
    committed: u64,
    refused: u64,
    used: f64,
    messages: i64,
}

async fn run(settings: &std::sync::Arc<Settings>, admin: &Client, round: usize, clients: usize, work: Work, limit: Limit, form: Form) -> Run {
    // Every run starts alike: no messages, no dead rows for autovacuum to take on mid-run,
    // no dirty pages for a checkpoint to write.
    for step in ["TRUNCATE app.messages", "VACUUM", "CHECKPOINT"] {
        admin.batch_execute(step).await.unwrap();
    }
    let mut redis = limit.redis(settings).await;
    let before = ledger(admin, &mut redis, limit, settings.users).await;
    // Every connection opens and prepares before the clock starts; a failure stops here.
    let mut sessions = Vec::with_capacity(clients);
    for _ in 0..clients {
        sessions.push(Session::open(settings, work, limit).await);
    }
    let (go, start) = tokio::sync::watch::channel(None);
    let tasks: Vec<_> = sessions
        .into_iter()
        .enumerate()
        .map(|(c, session)| {
            let seed = (round * 1_000_003 + clients * 1_009 + c) as u64;
            tokio::spawn(connection(settings.clone(), session, work, limit, form, seed, start.clone()))
        })
        .collect();
    let now = Instant::now();
    go.send(Some((now + settings.warmup, now + settings.warmup + settings.duration))).unwrap();
    let mut latencies = histogram();
    let (mut measured, mut committed, mut refused) = (0, 0, 0);
    for task in tasks {
        let tally = task.await.expect("a connection failed");
        latencies.add(&tally.latencies).unwrap();
        measured += tally.measured;
        committed += tally.committed;
        refused += tally.refused;
    }
    let after = ledger(admin, &mut redis, limit, settings.users).await;
    Run {
        round,
        clients,
        work,
        limit,
        form,
        latencies,
        rps: measured as f64 / settings.duration.as_secs_f64(),
        committed,
        refused,
        used: (after.0 - before.0).round(),
        messages: after.1 - before.1,
    }
}

fn append(path: &str, line: &str) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).unwrap();
    file.write_all(line.as_bytes()).unwrap();
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let settings = std::sync::Arc::new(Settings::from_env());
    std::fs::create_dir_all(&settings.out).unwrap();
    let runs_path = format!("{}/runs.tsv", settings.out);
    let cdf_path = format!("{}/cdf.tsv", settings.out);
    std::fs::write(&runs_path, "round\twork\tclients\tlimit\tform\trps\tp50_us\tp99_us\tp999_us\tcommitted\tused\tmessages\n").unwrap();
    std::fs::write(&cdf_path, "work\tclients\tlimit\tform\tpercentile\tlatency_us\n").unwrap();
    let (admin, connection) = tokio_postgres::connect(&settings.postgres, NoTls).await.expect("connect to Postgres");
    tokio::spawn(connection);

    let forms = [Form::Statements, Form::OneTrip];
    let mut merged: Vec<((Work, usize, Limit, Form), Histogram<u64>)> = Vec::new();
    let mut ledger_failures = 0;
    for round in 1..=settings.rounds {
        for work in [Work::Read, Work::Write] {
        for &clients in &settings.clients {
            for &limit in work.limits() {
                for form in forms {
                    let r = run(&settings, &admin, round, clients, work, limit, form).await;
                    // A read writes no message, and with no limit counts no token either.
                    let messages = if work == Work::Write { r.committed as i64 } else { 0 };
                    let used = if work == Work::Read && limit == Limit::None { 0.0 } else { r.committed as f64 };
                    let balanced = r.used == used && r.messages == messages && r.refused == 0;
                    if !balanced {
                        ledger_failures += 1;
                    }
                    let (p50, p99, p999) = (
                        r.latencies.value_at_quantile(0.5),
                        r.latencies.value_at_quantile(0.99),
                        r.latencies.value_at_quantile(0.999),
                    );
                    println!(
                        "round {} {:<5} clients {:>2} {:<15} {:<10} {:>7.0} req/s  p50 {:>6} µs  p99 {:>6} µs  p99.9 {:>6} µs  ledger {} committed, {} tokens, {} messages{}",
                        r.round, r.work.label(), r.clients, r.limit.label(), r.form.label(), r.rps, p50, p99, p999,
                        r.committed, r.used, r.messages,
                        if balanced { "" } else { "  MISMATCH" }
                    );
                    append(
                        &runs_path,
                        &format!(
                            "{}\t{}\t{}\t{}\t{}\t{:.1}\t{}\t{}\t{}\t{}\t{}\t{}\n",
                            r.round, r.work.label(), r.clients, r.limit.label(), r.form.label(), r.rps, p50, p99, p999,
                            r.committed, r.used, r.messages
                        ),
                    );
                    match merged.iter_mut().find(|(k, _)| *k == (work, clients, limit, form)) {
                        Some((_, h)) => h.add(&r.latencies).unwrap(),
                        None => merged.push(((work, clients, limit, form), r.latencies)),
                    }
                }
            }
        }
        }
    }
    // Every round's latencies together, for the chart's distribution.
    let mut cdf = String::new();
    for ((work, clients, limit, form), h) in &merged {
        for v in h.iter_quantiles(2) {
            writeln!(
                cdf,
                "{}\t{clients}\t{}\t{}\t{}\t{}",
                work.label(),
                limit.label(),
                form.label(),
                v.percentile(),
                v.value_iterated_to()
            )
            .unwrap();
        }
    }
    append(&cdf_path, &cdf);
    if ledger_failures > 0 {
        eprintln!("ledger: {ledger_failures} runs where the tokens used, the messages and the committed requests differ");
        std::process::exit(1);
    }
}
