//! rate_limiter from sqlx: the limit and the application's write in one transaction
//! (`pool.begin()`, committed or dropped), the decision mapped with `FromRow`, and RL429
//! turned into the application's `RateLimited` with `retryAfter` from the DETAIL.
//! Connection: the libpq environment (PGHOST, PGPORT, PGUSER, PGDATABASE).

use sqlx::postgres::{PgConnectOptions, PgDatabaseError, PgPool};
use sqlx::{FromRow, PgConnection};

/// `rate_limiter.decision`, column by column.
#[derive(Debug, FromRow)]
#[allow(dead_code)]
struct Decision {
    ok: bool,
    retry_after: Option<f64>,
    remaining: f64,
    reset_after: f64,
    granted: f64,
    reason: Option<String>,
    limited_by: Option<String>,
}

#[derive(Debug)]
#[allow(dead_code)] // the fields are read through Debug, when main returns an error
enum AppError {
    RateLimited { retry_after_ms: f64, sqlstate: String },
    Db(sqlx::Error),
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &e {
            if let Some(pg) = db.try_downcast_ref::<PgDatabaseError>() {
                if pg.code() == "RL429" {
                    let detail: serde_json::Value = serde_json::from_str(pg.detail().unwrap_or("{}")).unwrap_or_default();
                    let retry_after_ms = detail["retryAfter"].as_f64().unwrap_or(0.0);
                    return AppError::RateLimited { retry_after_ms, sqlstate: pg.code().to_owned() };
                }
            }
        }
        AppError::Db(e)
    }
}

async fn take(conn: &mut PgConnection, user: &str, throws: bool) -> Result<Decision, AppError> {
    Ok(sqlx::query_as::<_, Decision>("SELECT * FROM rate_limiter.rate_limit('sqlx_send', $1, throws => $2)")
        .bind(user)
        .bind(throws)
        .fetch_one(conn)
        .await?)
}

async fn remaining(pool: &PgPool, user: &str) -> Result<f64, AppError> {
    // count => 0: what is left now (a token bucket refills continuously: printed rounded).
    let d = sqlx::query_as::<_, Decision>("SELECT * FROM rate_limiter.check_rate_limit('sqlx_send', $1, count => 0)")
        .bind(user)
        .fetch_one(pool)
        .await?;
    Ok(d.remaining)
}

async fn bodies(pool: &PgPool) -> Result<Vec<String>, AppError> {
    Ok(sqlx::query_scalar("SELECT body FROM sqlx_messages").fetch_all(pool).await?)
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    let pool = PgPool::connect_with(PgConnectOptions::new()).await?; // reads PGHOST, PGPORT, ...
    for sql in [
        "SELECT rate_limiter.define('sqlx_send', 'token bucket', 3, '1 hour')",
        "SELECT rate_limiter.reset_rate_limit('sqlx_send', 'alice')",
        "DROP TABLE IF EXISTS sqlx_messages",
        "CREATE TABLE sqlx_messages (author text, body text)",
    ] {
        sqlx::query(sql).execute(&pool).await?;
    }

    // 1. The limit and the write commit together.
    let mut tx = pool.begin().await?;
    let d = take(&mut tx, "alice", false).await?;
    sqlx::query("INSERT INTO sqlx_messages VALUES ('alice', 'hello')").execute(&mut *tx).await?;
    tx.commit().await?;
    println!("1. committed: ok={}, messages={:?}, remaining={:.2}", d.ok, bodies(&pool).await?, remaining(&pool, "alice").await?);

    // 2. An application error after the limit was taken: the transaction is dropped, rolled back.
    let failed: Result<(), String> = async {
        let mut tx = pool.begin().await.map_err(|e| e.to_string())?;
        take(&mut tx, "alice", false).await.map_err(|e| format!("{e:?}"))?;
        sqlx::query("INSERT INTO sqlx_messages VALUES ('alice', 'lost')").execute(&mut *tx).await.map_err(|e| e.to_string())?;
        Err("the application failed".to_owned())
    }
    .await;
    assert_eq!(failed, Err("the application failed".to_owned()));
    println!("2. rolled back: messages={:?}, remaining={:.2}", bodies(&pool).await?, remaining(&pool, "alice").await?);

    // 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
    let mut tx = pool.begin().await?;
    for _ in 0..3 {
        match take(&mut tx, "alice", true).await {
            Ok(_) => continue,
            Err(AppError::RateLimited { retry_after_ms, sqlstate }) => {
                println!("3. RateLimited from SQLSTATE {sqlstate}: retry after {} s", (retry_after_ms / 1000.0).round());
                break;
            }
            Err(e) => return Err(e),
        }
    }
    drop(tx);
    Ok(())
}
