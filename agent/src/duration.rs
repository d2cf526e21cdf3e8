//! Durations as manifests and settings write them: `90s`, `30m`, `24h`, `7d`.

use std::time::Duration;

/// Parses an idle timeout: `0` or `off` (never closed as idle), or a duration such as `90s`,
/// `30m`, `24h`, `7d`.
pub fn parse_idle_timeout(text: &str) -> Result<Option<Duration>, String> {
    let text = text.trim();
    if text == "off" || text == "0" {
        return Ok(None);
    }
    let duration = parse_duration(text)?;
    Ok((!duration.is_zero()).then_some(duration))
}

/// `90s`, `30m`, `24h`, `7d`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit (s, m, h or d)"))?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number"))?;
    let seconds = match unit {
        "s" => n,
        "m" => n.saturating_mul(60),
        "h" => n.saturating_mul(3_600),
        "d" => n.saturating_mul(86_400),
        other => {
            return Err(format!(
                "{other:?} in {text:?} is not a unit (s, m, h or d)"
            ))
        }
    };
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_timeouts_parse_with_zero_meaning_never() {
        assert_eq!(parse_idle_timeout("0").unwrap(), None);
        assert_eq!(parse_idle_timeout("off").unwrap(), None);
        assert_eq!(parse_idle_timeout("0s").unwrap(), None);
        assert_eq!(
            parse_idle_timeout("30m").unwrap(),
            Some(Duration::from_secs(1_800))
        );
        for bad in ["banana", "30", "m", "5w", "-3h", ""] {
            assert!(parse_idle_timeout(bad).is_err(), "{bad}");
        }
    }
}
