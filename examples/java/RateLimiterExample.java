// rate_limiter from plain JDBC (Debian's libpostgresql-jdbc-java): the limit and the
// application's write in one transaction (autocommit off), RL429 turned into RateLimited
// via SQLException.getSQLState() and the server error's DETAIL.
// Run: java -cp /usr/share/java/postgresql.jar RateLimiterExample.java
// Connection: jdbc:postgresql://127.0.0.1:$PGPORT/$PGDATABASE as $PGUSER.
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.postgresql.util.PSQLException;

public class RateLimiterExample {
    static class RateLimited extends Exception {
        final double retryAfterMs;

        RateLimited(double retryAfterMs, SQLException cause) {
            super("rate limited, retry after " + retryAfterMs + " ms", cause);
            this.retryAfterMs = retryAfterMs;
        }
    }

    static final Pattern RETRY_AFTER = Pattern.compile("\"retryAfter\":([0-9.eE+-]+)");

    static boolean take(Connection c, String user, boolean throwsOn) throws SQLException, RateLimited {
        try (PreparedStatement s = c.prepareStatement(
                "SELECT ok, remaining FROM rate_limiter.rate_limit('jdbc_send', ?, throws => ?)")) {
            s.setString(1, user);
            s.setBoolean(2, throwsOn);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                return r.getBoolean("ok");
            }
        } catch (SQLException e) {
            if ("RL429".equals(e.getSQLState()) && e instanceof PSQLException p) {
                // The DETAIL is JSON; a JSON library would parse it, a pattern is enough here.
                Matcher m = RETRY_AFTER.matcher(p.getServerErrorMessage().getDetail());
                if (m.find()) throw new RateLimited(Double.parseDouble(m.group(1)), e);
            }
            throw e;
        }
    }

    static String remaining(Connection c, String user) throws SQLException {
        // count => 0: what is left now; rounded, as a token bucket refills continuously.
        try (PreparedStatement s = c.prepareStatement(
                "SELECT remaining FROM rate_limiter.check_rate_limit('jdbc_send', ?, count => 0)")) {
            s.setString(1, user);
            try (ResultSet r = s.executeQuery()) {
                r.next();
                return String.format("%.2f", r.getDouble(1));
            }
        }
    }

    static List<String> bodies(Connection c) throws SQLException {
        List<String> bodies = new ArrayList<>();
        try (Statement s = c.createStatement(); ResultSet r = s.executeQuery("SELECT body FROM jdbc_messages")) {
            while (r.next()) bodies.add(r.getString(1));
        }
        return bodies;
    }

    static void insert(Connection c, String body) throws SQLException {
        try (PreparedStatement s = c.prepareStatement("INSERT INTO jdbc_messages VALUES ('alice', ?)")) {
            s.setString(1, body);
            s.executeUpdate();
        }
    }

    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://127.0.0.1:" + System.getenv().getOrDefault("PGPORT", "5432") + "/"
                + System.getenv().getOrDefault("PGDATABASE", "postgres");
        try (Connection c = DriverManager.getConnection(url, System.getenv().getOrDefault("PGUSER", "postgres"), "")) {
            try (Statement s = c.createStatement()) {
                s.execute("SELECT rate_limiter.define('jdbc_send', 'token bucket', 3, '1 hour')");
                s.execute("SELECT rate_limiter.reset_rate_limit('jdbc_send', 'alice')");
                s.execute("DROP TABLE IF EXISTS jdbc_messages");
                s.execute("CREATE TABLE jdbc_messages (author text, body text)");
            }
            c.setAutoCommit(false);

            // 1. The limit and the write commit together.
            boolean ok = take(c, "alice", false);
            insert(c, "hello");
            c.commit();
            System.out.println("1. committed: ok=" + ok + ", messages=" + bodies(c) + ", remaining=" + remaining(c, "alice"));
            c.commit();

            // 2. An application error after the limit was taken: both roll back.
            try {
                take(c, "alice", false);
                insert(c, "lost");
                throw new IllegalStateException("the application failed");
            } catch (IllegalStateException e) {
                c.rollback();
            }
            System.out.println("2. rolled back: messages=" + bodies(c) + ", remaining=" + remaining(c, "alice"));
            c.commit();

            // 3. Past the limit, throws => true raises RL429; the DETAIL's retryAfter comes along.
            try {
                for (int i = 0; i < 3; i++) take(c, "alice", true);
                c.commit();
            } catch (RateLimited e) {
                c.rollback();
                System.out.println("3. RateLimited from SQLSTATE " + ((SQLException) e.getCause()).getSQLState()
                        + ": retry after " + Math.round(e.retryAfterMs / 1000) + " s");
            }
        }
    }
}
