//! Keys made from client addresses: `ip_key`, decided by an address's bits, not its notation.

#[pgrx::pg_schema]
mod tests {
    use pgrx::prelude::*;

    use crate::pg_tests::helpers::*;

    fn key(args: &str) -> Option<String> {
        one::<String>(&format!("SELECT rate_limiter.ip_key({args})"))
    }

    #[pg_test]
    fn an_ipv4_mapped_address_is_its_ipv4_address_whatever_its_notation() {
        assert_eq!(key("'203.0.113.7'").as_deref(), Some("203.0.113.7/32"));
        assert_eq!(key("'::ffff:203.0.113.7'"), key("'203.0.113.7'"));
        // express-rate-limit's CVE-2026-30827: two mapped addresses are two keys.
        assert_ne!(key("'::ffff:203.0.113.7'"), key("'::ffff:198.51.100.9'"));
        // The same mapped address written in hex.
        assert_eq!(key("'::ffff:102:304'").as_deref(), Some("1.2.3.4/32"));
        // Other IPv6 that merely ends in a dotted quad is keyed by its /56.
        assert_eq!(key("'2001:db8::1.2.3.4'").as_deref(), Some("2001:db8::/56"));
        // A mapped address is masked as IPv4.
        assert_eq!(key("'::ffff:203.0.113.7', v4_prefix => 24").as_deref(), Some("203.0.113.0/24"));
    }

    /// 0.4.0 keyed these by their /56: every IPv4 client behind one NAT64 gateway shared a
    /// key, and one 6to4 site (an IPv4 address's /48) had 256 keys to rotate through.
    #[pg_test]
    fn ipv6_that_carries_a_clients_ipv4_address_is_keyed_as_that_address() {
        // NAT64's well-known prefix (RFC 6052): the IPv4 client in the last 32 bits.
        assert_eq!(key("'64:ff9b::1.2.3.4'").as_deref(), Some("1.2.3.4/32"));
        assert_eq!(key("'64:ff9b::102:304'"), key("'64:ff9b::1.2.3.4'"), "its bits, not its notation");
        assert_ne!(key("'64:ff9b::1.2.3.4'"), key("'64:ff9b::1.2.3.5'"), "two clients, two keys");
        // 6to4 (RFC 3056): the site's IPv4 address in bits 16 to 47, whatever the rest.
        assert_eq!(key("'2002:c000:0204::1'").as_deref(), Some("192.0.2.4/32"));
        assert_eq!(key("'2002:c000:0204:ff00::9'"), key("'2002:c000:0204::1'"), "one site, one key");
        // Teredo (RFC 4380): the client's public address, its bits inverted, in the last 32.
        assert_eq!(key("'2001:0:4136:e378:8000:63bf:3fff:fdd2'").as_deref(), Some("192.0.2.45/32"));
        // Masked as IPv4.
        assert_eq!(key("'2002:c000:0204::1', v4_prefix => 24").as_deref(), Some("192.0.2.0/24"));
        assert_eq!(key("'64:ff9b::1.2.3.4', 24, 128").as_deref(), Some("1.2.3.0/24"));
        // Near the prefixes, not in them: IPv6.
        assert_eq!(key("'64:ff9b:1::1.2.3.4'").as_deref(), Some("64:ff9b:1::/56"));
        assert_eq!(key("'2001:1::1'").as_deref(), Some("2001:1::/56"));
    }

    #[pg_test]
    fn ipv6_is_keyed_by_its_prefix_and_ipv4_by_its_own() {
        assert_eq!(key("'2001:db8:1234:5600::1'"), key("'2001:db8:1234:56ff:ffff::9'"), "one /56");
        assert_eq!(key("'2001:db8:1234:5600::1'").as_deref(), Some("2001:db8:1234:5600::/56"));
        assert_ne!(key("'2001:db8:1234:5600::1'"), key("'2001:db8:1234:5700::1'"), "the next /56");
        assert_eq!(key("'2001:db8::1', v6_prefix => 128").as_deref(), Some("2001:db8::1/128"));
        assert_eq!(key("'2001:db8::1', v6_prefix => 0").as_deref(), Some("::/0"));
        assert_eq!(key("'10.1.2.3', 8").as_deref(), Some("10.0.0.0/8"));
        // The address's own mask plays no part: its bits do.
        assert_eq!(key("'10.1.2.3/8'"), key("'10.1.2.3'"));
        assert_eq!(key("NULL"), None, "STRICT");
    }

    #[pg_test]
    fn bad_prefixes_are_22023() {
        fails("SELECT rate_limiter.ip_key('1.2.3.4', 33)", "22023", "v4_prefix must be between 0 and 32");
        fails("SELECT rate_limiter.ip_key('1.2.3.4', -1)", "22023", "v4_prefix");
        fails("SELECT rate_limiter.ip_key('::1', 32, 129)", "22023", "v6_prefix must be between 0 and 128");
        // Checked whatever the address's family, so a bad call fails on the first address.
        fails("SELECT rate_limiter.ip_key('::1', 40)", "22023", "v4_prefix");
    }
}
