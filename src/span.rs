//! Durations as users write them (`90m`, `24h`, `7d`, `3600`): one parser, with checked
//! arithmetic, for every flag, annotation and Secret setting that takes one.
use std::time::Duration;

/// A positive duration: `90m`, `24h`, `7d`, or seconds (with `s` or without a unit).
pub fn parse(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 3600s, 90m, 24h or 7d"))?;
    let secs = match unit {
        "" | "s" => Some(n),
        "m" => n.checked_mul(60),
        "h" => n.checked_mul(3600),
        "d" => n.checked_mul(86400),
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h or d)")),
    };
    match secs {
        None => Err(format!("{s:?} is too long")),
        Some(0) => Err(format!("{s:?}: at least 1s")),
        Some(n) => Ok(Duration::from_secs(n)),
    }
}

/// A token's lifetime: TokenRequest issues nothing shorter than 10 minutes.
pub fn parse_token_lifetime(s: &str) -> Result<Duration, String> {
    let d = parse(s)?;
    if d < Duration::from_secs(600) {
        return Err(format!("{s:?}: TokenRequest needs at least 10 minutes"));
    }
    Ok(d)
}

/// An optional duration: `off` (or empty) is none.
pub fn parse_optional(s: &str) -> Result<Option<Duration>, String> {
    match s.trim() {
        "" | "off" => Ok(None),
        s => parse(s).map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_durations() {
        assert_eq!(parse_optional("300"), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_optional("5m"), Ok(Some(Duration::from_secs(300))));
        assert_eq!(parse_optional("2h"), Ok(Some(Duration::from_secs(7200))));
        assert_eq!(parse_optional("off"), Ok(None));
        assert_eq!(parse_optional(""), Ok(None));
        assert!(parse_optional("0").is_err());
        assert!(parse_optional("5 minutes").is_err());
        assert!(parse_optional("-3").is_err());
        assert!(parse_optional("99999999999999999d").is_err());
    }
}
