//! A cluster's id: the uid of its kube-system namespace, which an API server generates as a UUID
//! (its canonical text, 8-4-4-4-12 hex digits). What a remote answers is untrusted: it is parsed
//! here, its length checked before anything else, and only a UUID goes on (recorded on every
//! follower, on the health Lease, in messages). Anything else is refused with a message that
//! shows its length and at most [`SHOWN`] characters of it, never the whole.
use std::fmt;

/// The length of a UUID's canonical text.
const LEN: usize = 36;
/// How many characters of a value that is not a UUID a message shows (escaped).
pub const SHOWN: usize = 40;

/// A cluster id that is a UUID, kept in lower case (a server answers in lower case; a pin
/// written in upper case means the same id).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClusterId(String);

/// A value that is not a UUID: its length and its beginning, escaped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{shown} ({len} bytes) is not a UUID (8-4-4-4-12 hexadecimal digits)")]
pub struct NotAUuid {
    /// the value's length in bytes
    pub len: usize,
    /// at most [`SHOWN`] characters of it once escaped, quoted (`…` after when cut)
    pub shown: String,
}

impl NotAUuid {
    /// Its length, and at most [`SHOWN`] characters of it once escaped (the rest is not read).
    fn of(text: &str) -> Self {
        let mut escaped = text.chars().flat_map(char::escape_debug);
        let head: String = escaped.by_ref().take(SHOWN).collect();
        let cut = if escaped.next().is_some() { "…" } else { "" };
        Self {
            len: text.len(),
            shown: format!("\"{head}\"{cut}"),
        }
    }
}

impl ClusterId {
    /// Pure: `text` as a cluster id, if it is a UUID's canonical text (either case).
    pub fn parse(text: &str) -> Result<Self, NotAUuid> {
        // the length first: a long value is refused without reading it
        if text.len() != LEN {
            return Err(NotAUuid::of(text));
        }
        let canonical = text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => b.is_ascii_hexdigit(),
        });
        if !canonical {
            return Err(NotAUuid::of(text));
        }
        Ok(Self(text.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ClusterId {
    type Err = NotAUuid;

    fn from_str(s: &str) -> Result<Self, NotAUuid> {
        Self::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7c";

    #[test]
    fn a_uuid_is_a_cluster_id_in_lower_case() {
        assert_eq!(ClusterId::parse(UID).unwrap().as_str(), UID);
        let upper = UID.to_ascii_uppercase();
        assert_eq!(ClusterId::parse(&upper).unwrap().as_str(), UID);
        assert_eq!(UID.parse::<ClusterId>().unwrap().to_string(), UID);
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            "",
            "east",
            "kube-system",
            // one short, one long
            &UID[1..],
            &format!("{UID}0"),
            // hyphens elsewhere, none, braces, a URN
            "0f6b3c1e5-4d2-4a8e-9c7b-2d1e0a9f8b7c",
            "0f6b3c1e54d24a8e9c7b2d1e0a9f8b7c0000",
            "{0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7}",
            "urn:uuid:0f6b3c1e-54d2-4a8e-9c7b-2d1e",
            // not hex, a space, a newline, a non-ASCII digit
            "0f6b3c1g-54d2-4a8e-9c7b-2d1e0a9f8b7c",
            "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7 ",
            "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b\n7",
            "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b٣",
        ] {
            let why = ClusterId::parse(bad).expect_err(bad);
            assert_eq!(why.len, bad.len(), "{bad:?}");
            assert!(!why.to_string().contains('\n'), "one line: {why}");
        }
    }

    #[test]
    fn a_huge_value_is_shown_by_its_length_and_a_few_escaped_characters() {
        // a 200 KB "uid": the message names its length and shows 40 characters, escaped
        let huge = format!("\u{1b}[31m{}", "a".repeat(200 * 1024));
        let why = ClusterId::parse(&huge).unwrap_err();
        let said = why.to_string();
        assert_eq!(why.len, huge.len());
        assert!(said.len() < 200, "{} bytes: {said}", said.len());
        assert!(said.contains(&format!("({} bytes)", huge.len())), "{said}");
        assert!(said.contains("\\u{1b}[31m"), "escaped: {said}");
        assert!(said.contains('…'), "said to be cut: {said}");
        assert!(!said.contains('\u{1b}'), "no control character: {said}");
    }

    #[test]
    fn every_uuid_shape_with_any_digits_parses_and_any_one_byte_changed_to_a_non_digit_does_not() {
        // each position, each kind of byte: only a hex digit where a digit goes, and a hyphen
        // where a hyphen goes
        for i in 0..LEN {
            for b in [b'0', b'9', b'a', b'F', b'-', b'g', b' ', b'/', 0xff_u8] {
                let mut bytes = UID.as_bytes().to_vec();
                bytes[i] = b;
                let Ok(text) = String::from_utf8(bytes) else {
                    continue;
                };
                let hyphen = matches!(i, 8 | 13 | 18 | 23);
                let ok = if hyphen {
                    b == b'-'
                } else {
                    b.is_ascii_hexdigit()
                };
                assert_eq!(ClusterId::parse(&text).is_ok(), ok, "{text:?}");
            }
        }
    }
}
