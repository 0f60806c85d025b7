//! dlock's session settings: the `-c` options of the start-up packet (no extra round trip),
//! dropped one at a time where an older server refuses them, and the TCP keepalives on both
//! ends, chosen so that neither side gives up on a live holder before `--ttl`.

use std::time::Duration;

use tokio_postgres::Config;

/// `-c name=value` start-up options: no timeouts that could end a live hold, `--wait` as the
/// server's own lock wait limit, `idle_session_timeout` = `ttl` so the server ends a session
/// (and frees its lock) that sent nothing for the TTL (the keeper heartbeats at least every TTL/3; the
/// session is idle between statements), keepalives that give a silent client at least
/// `ttl` before its session is dropped, and `synchronous_commit=off`: no commit of ours needs
/// to be on disk before its reply (the fencing token's clock covers a lost one, see
/// [`TOKEN`](super::token::TOKEN)).
pub(super) fn session_options(
    ttl: Duration,
    lock_timeout: Option<Duration>,
    features: Features,
) -> String {
    let (idle, interval, count) = keepalives(ttl);
    // Beyond the server's range (~24.8 days) the client-side backstop ends the wait instead.
    let lock_ms = match lock_timeout {
        Some(d) if d.as_millis() <= i32::MAX as u128 => d.as_millis().max(1),
        _ => 0,
    };
    let mut options = format!(
        "-c dlock.session=on -c statement_timeout=0 -c idle_in_transaction_session_timeout=0 -c lock_timeout={lock_ms} \
         -c synchronous_commit=off \
         -c tcp_keepalives_idle={idle} -c tcp_keepalives_interval={interval} -c tcp_keepalives_count={count} \
         -c tcp_user_timeout={}",
        server_millis(ttl)
    );
    if features.idle_timeout {
        options.push_str(&format!(" -c idle_session_timeout={}", server_millis(ttl)));
    }
    if features.check_interval {
        options.push_str(" -c client_connection_check_interval=1000");
    }
    options
}

/// `ttl` in milliseconds, at least a second and at most what a server setting holds (i32).
fn server_millis(ttl: Duration) -> u128 {
    ttl.as_millis().clamp(1000, i32::MAX as u128)
}

/// Linux's limits for TCP_KEEPIDLE and TCP_KEEPINTVL (seconds) and TCP_KEEPCNT.
const MAX_KEEPALIVE: Duration = Duration::from_secs(32767);
const MAX_KEEPALIVE_COUNT: u64 = 127;
/// TCP_USER_TIMEOUT is milliseconds in an int.
const MAX_USER_TIMEOUT: Duration = Duration::from_millis(i32::MAX as u64);

/// Server-side keepalives `(idle, interval, count)` in seconds that notice a silent client no
/// sooner than `ttl`: `idle + interval·(count − 1) ≥ ttl`, each within Linux's limits (a value
/// out of range is only logged by the server, which then keeps the OS default of ~2 hours).
fn keepalives(ttl: Duration) -> (u64, u64, u64) {
    let max = MAX_KEEPALIVE.as_secs();
    let ttl_s = ttl.as_secs().max(2);
    let idle = ttl_s.div_ceil(2).min(max);
    let rest = ttl_s - idle;
    let interval = rest.div_ceil(MAX_KEEPALIVE_COUNT - 1).clamp(1, max);
    let count = (rest.div_ceil(interval) + 1).min(MAX_KEEPALIVE_COUNT);
    (idle, interval, count)
}

/// Session settings a server may not know, dropped one at a time when it refuses them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Features {
    /// `idle_session_timeout` (PostgreSQL 14+).
    pub(super) idle_timeout: bool,
    /// `client_connection_check_interval` (PostgreSQL 14+, and only where the platform can
    /// watch client sockets).
    pub(super) check_interval: bool,
}

impl Features {
    pub(super) const ALL: Features = Features {
        idle_timeout: true,
        check_interval: true,
    };

    /// The settings to try after the server refused the connection with `error`, if one of
    /// ours is to blame.
    pub(super) fn without(self, error: &str) -> Option<Features> {
        if error.contains("unrecognized configuration parameter") {
            // Older than 14: neither exists.
            let fewer = Features {
                idle_timeout: false,
                check_interval: false,
            };
            return (fewer != self).then_some(fewer);
        }
        if self.check_interval && error.contains("client_connection_check_interval") {
            return Some(Features {
                check_interval: false,
                ..self
            });
        }
        if self.idle_timeout && error.contains("idle_session_timeout") {
            return Some(Features {
                idle_timeout: false,
                ..self
            });
        }
        None
    }
}

/// The client side's TCP keepalives and user timeout: a silent server is given up on after
/// about a third of the TTL.
pub(super) fn client_keepalives(config: &mut Config, ttl: Duration) {
    // Linux refuses keepalive times above 32767 s (TCP_KEEPIDLE).
    config
        .keepalives(true)
        .keepalives_idle((ttl / 6).clamp(Duration::from_secs(1), MAX_KEEPALIVE))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(3)
        .tcp_user_timeout((ttl / 3).clamp(Duration::from_secs(1), MAX_USER_TIMEOUT));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_give_the_server_a_ttl_of_silence() {
        let options = session_options(
            Duration::from_secs(10),
            Some(Duration::from_millis(300)),
            Features::ALL,
        );
        assert!(options.contains("lock_timeout=300 "), "{options}");
        assert!(options.contains("tcp_keepalives_idle=5 "), "{options}");
        assert!(options.contains("tcp_keepalives_count=6 "), "{options}");
        assert!(options.contains("idle_session_timeout=10000"), "{options}");
        assert!(
            options.contains("client_connection_check_interval=1000"),
            "{options}"
        );
        let old = Features {
            idle_timeout: false,
            check_interval: false,
        };
        let options = session_options(Duration::from_secs(10), None, old);
        assert!(!options.contains("client_connection"), "{options}");
        assert!(!options.contains("idle_session"), "{options}");
    }

    #[test]
    fn refused_settings_are_dropped_one_at_a_time() {
        let refused =
            Features::ALL.without("unrecognized configuration parameter \"idle_session_timeout\"");
        assert_eq!(
            refused,
            Some(Features {
                idle_timeout: false,
                check_interval: false
            })
        );
        assert_eq!(
            refused.and_then(|f| f.without("unrecognized configuration parameter")),
            None
        );
        let no_check = Features::ALL
            .without("client_connection_check_interval must be set to 0 on this platform");
        assert_eq!(
            no_check,
            Some(Features {
                idle_timeout: true,
                check_interval: false
            })
        );
        assert_eq!(
            Features::ALL.without("password authentication failed"),
            None
        );
    }

    #[test]
    fn keepalives_stay_in_linux_range_and_cover_the_ttl() {
        for secs in [1, 2, 3, 10, 599, 600, 3600, 86_400, 3 * 86_400, 7 * 86_400] {
            let (idle, interval, count) = keepalives(Duration::from_secs(secs));
            assert!((1..=32767).contains(&idle), "{secs}s: idle {idle}");
            assert!(
                (1..=32767).contains(&interval),
                "{secs}s: interval {interval}"
            );
            assert!((1..=127).contains(&count), "{secs}s: count {count}");
            assert!(
                idle + interval * (count - 1) >= secs,
                "{secs}s: the server would drop a silent client after {idle}+{interval}·({count}-1)"
            );
        }
        assert!(server_millis(Duration::from_secs(7 * 86_400)) <= i32::MAX as u128);
    }
}
