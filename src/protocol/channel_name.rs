//! Channel names and channel patterns (§3, §7, §9).
//!
//! A channel is dotted and hierarchical (`team.backend`); each segment is sanitized like any
//! other token. Two types keep the §3 rules apart:
//!
//! - [`Channel`] is concrete: no `*`/`>` segment. It is the only thing a message can be
//!   published to, and the key of the channel registry (§7).
//! - [`ChannelPattern`] may hold `*` and `>` as *whole* segments, `>` only last. It is what a
//!   subscription or an ACL entry (`subscribe`, `allowSubscribe`, `allowPublish`, §9) names.
//!
//! The lenient constructors (`new`) sanitize, for turning user input into wire form. ACL
//! lists must go through the strict [`ChannelPattern::from_policy`] instead: a policy entry that
//! sanitization would silently change (`foo/bar` → `foo_bar`) could grant a different channel
//! than the one its author wrote, so it is refused. Coverage checks ([`ChannelPattern::matches`],
//! [`ChannelPattern::covers`], [`is_covered`]) follow NATS semantics: `team.>` covers
//! `team.backend` but not `team`.

use std::fmt;

use super::subject::{is_token_char, sanitize, subject_matches};

/// Why a string is not a channel or channel pattern.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelError {
    /// The channel is empty.
    #[error("channel name is empty")]
    Empty,
    /// A segment is empty (leading, trailing or doubled `.`).
    #[error("channel {channel:?} has an empty segment at position {index}")]
    EmptySegment {
        /// The refused channel.
        channel: String,
        /// Zero-based segment index.
        index: usize,
    },
    /// A publish target or registry key holds a wildcard segment.
    #[error("channel {channel:?} is a wildcard; a publish target must be concrete")]
    Wildcard {
        /// The refused channel.
        channel: String,
    },
    /// `>` appears before the last segment.
    #[error("channel {channel:?} has '>' before its last segment")]
    TailWildcardNotLast {
        /// The refused channel.
        channel: String,
    },
    /// A policy entry holds a character that sanitization would replace.
    #[error(
        "channel policy {channel:?} has {found:?} in segment {index}; \
         segments must be [A-Za-z0-9_-]+, '*', or a final '>'"
    )]
    NotCanonical {
        /// The refused entry.
        channel: String,
        /// Zero-based segment index.
        index: usize,
        /// The offending character.
        found: char,
    },
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Wildcards {
    Refused,
    Allowed,
}

/// Sanitizes each segment; keeps whole-segment wildcards only if allowed.
fn build(raw: &str, wildcards: Wildcards) -> Result<String, ChannelError> {
    if raw.is_empty() {
        return Err(ChannelError::Empty);
    }
    let segments: Vec<&str> = raw.split('.').collect();
    let last = segments.len() - 1;
    let mut out = String::with_capacity(raw.len());
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() {
            return Err(ChannelError::EmptySegment {
                channel: raw.to_owned(),
                index,
            });
        }
        if index > 0 {
            out.push('.');
        }
        match *segment {
            "*" | ">" if wildcards == Wildcards::Refused => {
                return Err(ChannelError::Wildcard {
                    channel: raw.to_owned(),
                });
            }
            ">" if index != last => {
                return Err(ChannelError::TailWildcardNotLast {
                    channel: raw.to_owned(),
                });
            }
            "*" | ">" => out.push_str(segment),
            other => out.push_str(&sanitize(other)),
        }
    }
    Ok(out)
}

/// A concrete channel: dotted, every segment a sanitized non-empty token, no wildcard (§3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Channel(String);

impl Channel {
    /// Sanitizes each segment of `raw`. Refuses empty names, empty segments and wildcards.
    pub fn new(raw: &str) -> Result<Self, ChannelError> {
        build(raw, Wildcards::Refused).map(Self)
    }

    /// The dotted channel as it appears in subjects and registry keys.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The channel as a (wildcard-free) pattern, e.g. for a subscription.
    pub fn to_pattern(&self) -> ChannelPattern {
        ChannelPattern(self.0.clone())
    }
}

impl fmt::Display for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A subscription or ACL pattern: sanitized segments, `*` and a final `>` preserved (§3).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChannelPattern(String);

impl ChannelPattern {
    /// Sanitizes each non-wildcard segment of `raw`.
    pub fn new(raw: &str) -> Result<Self, ChannelError> {
        build(raw, Wildcards::Allowed).map(Self)
    }

    /// Strict validation for ACL entries (§9): every segment must already be
    /// `[A-Za-z0-9_-]+`, `*`, or a final `>`; nothing is rewritten.
    pub fn from_policy(raw: &str) -> Result<Self, ChannelError> {
        for (index, segment) in raw.split('.').enumerate() {
            if segment == "*" || segment == ">" {
                continue;
            }
            if let Some(found) = segment.chars().find(|c| !is_token_char(*c)) {
                return Err(ChannelError::NotCanonical {
                    channel: raw.to_owned(),
                    index,
                    found,
                });
            }
        }
        // Only structure is left to check; sanitization is now the identity.
        Self::new(raw)
    }

    /// The dotted pattern text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether the pattern has no wildcard segment.
    pub fn is_concrete(&self) -> bool {
        self.0.split('.').all(|s| s != "*" && s != ">")
    }

    /// The pattern as a publishable channel, if it is concrete.
    pub fn to_channel(&self) -> Result<Channel, ChannelError> {
        Channel::new(&self.0)
    }

    /// NATS matching of one concrete channel against this pattern.
    pub fn matches(&self, channel: &Channel) -> bool {
        subject_matches(&self.0, &channel.0)
    }

    /// Whether every channel `other` can match is also matched by `self` (e.g. a `subscribe`
    /// entry must be covered by `allowSubscribe`, §9). `a.>` covers `a.*` and `a.b.>`; `a.*`
    /// does not cover `a.>`.
    pub fn covers(&self, other: &ChannelPattern) -> bool {
        let mut mine = self.0.split('.');
        let mut theirs = other.0.split('.');
        loop {
            match (mine.next(), theirs.next()) {
                (Some(">"), Some(_)) => return true,
                (Some(_), Some(">")) => return false,
                (Some("*"), Some(_)) => {}
                (Some(m), Some(t)) if m == t => {}
                (None, None) => return true,
                _ => return false,
            }
        }
    }
}

impl fmt::Display for ChannelPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Channel> for ChannelPattern {
    fn from(channel: Channel) -> Self {
        Self(channel.0)
    }
}

/// The name of `candidates` nearest to `name` by edit distance, when one is near enough to be
/// a typo of it (at most two characters apart): what a "did you mean" names.
pub fn closest<'a>(name: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    candidates
        .into_iter()
        .filter(|c| *c != name)
        .map(|c| (strsim::levenshtein(c, name), c))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, c)| c)
}

/// Whether `channel` is covered by any entry of the allow-list (§9 read/post ACL check).
pub fn is_covered(allow: &[ChannelPattern], channel: &Channel) -> bool {
    allow.iter().any(|p| p.matches(channel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closest_names_a_typo_two_characters_apart_at_most() {
        let known = ["general", "team.backend", "random"];
        assert_eq!(closest("generl", known), Some("general"));
        assert_eq!(closest("team.frontend", known), None);
        assert_eq!(closest("general", known), None, "not a typo of itself");
        assert_eq!(
            closest("géneral", known),
            Some("general"),
            "counted in characters"
        );
        assert_eq!(closest("gnrl", known), None, "three apart");
    }

    fn pat(s: &str) -> ChannelPattern {
        ChannelPattern::new(s).unwrap()
    }

    fn ch(s: &str) -> Channel {
        Channel::new(s).unwrap()
    }

    #[test]
    fn channel_sanitizes_each_segment() {
        assert_eq!(ch("team.backend").as_str(), "team.backend");
        assert_eq!(ch("my team.back/end").as_str(), "my_team.back_end");
        assert_eq!(ch("a*.b>").as_str(), "a_.b_");
    }

    #[test]
    fn channel_refusals() {
        assert_eq!(Channel::new(""), Err(ChannelError::Empty));
        assert_eq!(
            Channel::new("a..b"),
            Err(ChannelError::EmptySegment {
                channel: "a..b".into(),
                index: 1
            })
        );
        assert_eq!(
            Channel::new(".a"),
            Err(ChannelError::EmptySegment {
                channel: ".a".into(),
                index: 0
            })
        );
        for wild in ["team.*", "team.>", "*", ">", "a.*.b"] {
            assert_eq!(
                Channel::new(wild),
                Err(ChannelError::Wildcard {
                    channel: wild.into()
                })
            );
        }
    }

    #[test]
    fn pattern_keeps_whole_segment_wildcards() {
        assert_eq!(pat("team.>").as_str(), "team.>");
        assert_eq!(pat("*.x").as_str(), "*.x");
        assert_eq!(pat(">").as_str(), ">");
        assert_eq!(pat("a>.b*").as_str(), "a_.b_");
        assert!(!pat("team.>").is_concrete());
        assert!(pat("team.x").is_concrete());
        assert_eq!(pat("team.x").to_channel().unwrap(), ch("team.x"));
        assert!(pat("team.*").to_channel().is_err());
        assert_eq!(ch("a.b").to_pattern(), pat("a.b"));
        assert_eq!(ChannelPattern::from(ch("a.b")), pat("a.b"));
    }

    #[test]
    fn tail_wildcard_must_be_last() {
        assert_eq!(
            ChannelPattern::new("a.>.b"),
            Err(ChannelError::TailWildcardNotLast {
                channel: "a.>.b".into()
            })
        );
    }

    #[test]
    fn policy_refuses_anything_sanitization_would_change() {
        assert_eq!(
            ChannelPattern::from_policy("foo/bar"),
            Err(ChannelError::NotCanonical {
                channel: "foo/bar".into(),
                index: 0,
                found: '/'
            })
        );
        assert_eq!(
            ChannelPattern::from_policy("team.back end"),
            Err(ChannelError::NotCanonical {
                channel: "team.back end".into(),
                index: 1,
                found: ' '
            })
        );
        assert!(matches!(
            ChannelPattern::from_policy("a*"),
            Err(ChannelError::NotCanonical { found: '*', .. })
        ));
        assert!(matches!(
            ChannelPattern::from_policy("a.>.b"),
            Err(ChannelError::TailWildcardNotLast { .. })
        ));
        assert!(matches!(
            ChannelPattern::from_policy("a..b"),
            Err(ChannelError::EmptySegment { index: 1, .. })
        ));
        assert_eq!(ChannelPattern::from_policy(""), Err(ChannelError::Empty));
        for ok in ["team.backend", "team.>", "*.ops", ">", "a-b_c.*"] {
            assert_eq!(ChannelPattern::from_policy(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn matching_is_nats_semantics() {
        assert!(pat("team.>").matches(&ch("team.backend")));
        assert!(pat("team.>").matches(&ch("team.backend.db")));
        assert!(!pat("team.>").matches(&ch("team")));
        assert!(pat("team.*").matches(&ch("team.x")));
        assert!(!pat("team.*").matches(&ch("team.x.y")));
        assert!(pat(">").matches(&ch("anything")));
        assert!(pat("team").matches(&ch("team")));
        assert!(!pat("team").matches(&ch("teams")));
    }

    #[test]
    fn allow_list_coverage() {
        let allow = vec![pat("team.>"), pat("general")];
        assert!(is_covered(&allow, &ch("general")));
        assert!(is_covered(&allow, &ch("team.a")));
        assert!(!is_covered(&allow, &ch("team")));
        assert!(!is_covered(&allow, &ch("random")));
        assert!(!is_covered(&[], &ch("general")));
    }

    #[test]
    fn pattern_coverage() {
        assert!(pat("a.>").covers(&pat("a.*")));
        assert!(pat("a.>").covers(&pat("a.b.>")));
        assert!(pat("a.>").covers(&pat("a.b")));
        assert!(!pat("a.>").covers(&pat("a")));
        assert!(!pat("a.*").covers(&pat("a.>")));
        assert!(pat("a.*").covers(&pat("a.b")));
        assert!(pat("a.*").covers(&pat("a.*")));
        assert!(!pat("a.b").covers(&pat("a.*")));
        assert!(pat(">").covers(&pat(">")));
        assert!(pat(">").covers(&pat("x.*.>")));
        assert!(!pat("a.b").covers(&pat("a.b.c")));
    }
}
