//! Duration texts, as every duration option, variable and config key takes them: a number
//! with a unit or a bare number of seconds, bounded by [`MAX_DURATION`], and what is wrong with
//! any other text said in dlock's words.

use std::time::Duration;

use super::MAX_DURATION;

/// Parse a duration: a number with a unit (`500ms`, `30s`, `5m`, `1h30m`), or a bare number,
/// which is seconds (`1`, `0.5`), as `flock -w` and `timeout` read it. `0` only where
/// allowed. The error is a sentence of dlock's own, with the text as given.
pub fn parse_duration(text: &str, zero_allowed: bool) -> Result<Duration, String> {
    let text = text.trim();
    let duration = match bare_seconds(text) {
        Some(seconds) => seconds?,
        None => humantime::parse_duration(text).map_err(|e| not_a_duration(text, &e))?,
    };
    if duration.is_zero() && !zero_allowed {
        return Err(format!("'{text}' must be greater than zero"));
    }
    if duration > MAX_DURATION {
        return Err(too_long(text));
    }
    Ok(duration)
}

/// Examples of what a duration option takes, for messages.
const DURATION_FORMS: &str = "write e.g. 500ms, 30s, 5m or 1h30m (a bare number is seconds)";

fn too_long(text: &str) -> String {
    format!(
        "'{text}' is longer than the limit of {} years",
        MAX_DURATION.as_secs() / 31_557_600
    )
}

/// A number without a unit (`1`, `0.5`, `.5`), as seconds; `None` for any other text.
fn bare_seconds(text: &str) -> Option<Result<Duration, String>> {
    let (whole, fraction) = text.split_once('.').unwrap_or((text, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || !digits(fraction) || whole.len() + fraction.len() == 0 {
        return None;
    }
    let Ok(seconds) = (if whole.is_empty() {
        Ok(0)
    } else {
        whole.parse::<u64>()
    }) else {
        return Some(Err(too_long(text)));
    };
    // Nanoseconds: the first nine digits of the fraction, padded with zeros.
    let nanos = fraction
        .bytes()
        .chain(std::iter::repeat(b'0'))
        .take(9)
        .fold(0u32, |n, digit| n * 10 + u32::from(digit - b'0'));
    Some(Ok(Duration::new(seconds, nanos)))
}

/// What is wrong with `text`, which humantime could not read (`error`), in dlock's words.
fn not_a_duration(text: &str, error: &humantime::DurationError) -> String {
    use humantime::DurationError as Why;
    if text.starts_with('-') {
        return format!("'{text}' is negative; a duration is 0 or more: {DURATION_FORMS}");
    }
    match error {
        Why::Empty => format!("no duration given; {DURATION_FORMS}"),
        Why::NumberOverflow => too_long(text),
        Why::UnknownUnit { unit, .. } => format!(
            "'{text}' has the unknown unit '{unit}'; {DURATION_FORMS} (units: ms, s, m, h, d, w)"
        ),
        Why::InvalidCharacter(_) | Why::NumberExpected(_) => {
            format!("'{text}' is not a duration; {DURATION_FORMS}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_number_is_seconds_and_anything_else_needs_a_unit() {
        assert_eq!(
            parse_duration("500ms", false),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(parse_duration("5m", false), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("5", false), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("0.5", false), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(".25", false), Ok(Duration::from_millis(250)));
        assert_eq!(
            parse_duration("1.0000000019", false),
            Ok(Duration::new(1, 1))
        );
        assert!(parse_duration("0", false).is_err());
        assert!(parse_duration("0.0", false).is_err());
        assert_eq!(parse_duration("0", true), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.0", true), Ok(Duration::ZERO));
        assert!(parse_duration("-5s", false).is_err());
        assert!(parse_duration("5x", false).is_err());
        assert!(parse_duration("0s", false).is_err());
        assert!(parse_duration("", false).is_err());
        assert!(parse_duration(".", false).is_err());
        assert!(parse_duration("1.2.3", false).is_err());
    }

    /// What is wrong is said in dlock's words, never humantime's ("expected number at 0").
    #[test]
    fn a_bad_duration_is_explained_with_examples() {
        let error = |text: &str| parse_duration(text, true).expect_err(text);
        assert_eq!(
            error("-1s"),
            "'-1s' is negative; a duration is 0 or more: write e.g. 500ms, 30s, 5m or 1h30m \
             (a bare number is seconds)"
        );
        assert_eq!(
            error("5x"),
            "'5x' has the unknown unit 'x'; write e.g. 500ms, 30s, 5m or 1h30m (a bare number \
             is seconds) (units: ms, s, m, h, d, w)"
        );
        for text in ["soon", "1.2.3", "s5"] {
            assert_eq!(
                error(text),
                format!(
                    "'{text}' is not a duration; write e.g. 500ms, 30s, 5m or 1h30m (a bare \
                     number is seconds)"
                )
            );
        }
        assert!(error("").starts_with("no duration given; write e.g."));
    }

    #[test]
    fn durations_beyond_the_limit_are_refused() {
        assert_eq!(parse_duration("100y", false), Ok(MAX_DURATION));
        for text in [
            "18446744073709551615s",
            "9000y",
            "101y",
            "18446744073709551616",
        ] {
            let err = parse_duration(text, true).expect_err(text);
            assert!(err.contains("longer than the limit of 100 years"), "{err}");
        }
    }
}
