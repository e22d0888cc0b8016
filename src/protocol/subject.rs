//! Subject layout (§3): token sanitization, builders, and the sender-aware parser.
//!
//! Every wire subject is rooted at `cotal.<space>`. Each routing token is *sanitized*: any
//! character outside `[A-Za-z0-9_-]` becomes `_`. Sanitization is lossy and one-way; nothing
//! here decodes a token back into a display name. The parser is the other direction: it only
//! reads subjects whose every token is already in sanitized form, and locates the sender by
//! kind (§3 "sender-position asymmetry"): `chat` carries it at token 3 with the channel after
//! it, `inst`/`svc`/`ctl` at token 4 with the route target at token 3. Any other shape has no
//! sender and must not be read as a delivery.
//!
//! "Character" means Unicode scalar value: `é` and `😀` each become one `_`.

use std::fmt;

use super::channel_name::{Channel, ChannelPattern};

/// First token of every Cotal subject.
pub const ROOT: &str = "cotal";

/// Subject prefixes application messages must never use (§3).
pub const RESERVED_PREFIXES: [&str; 5] = ["$JS.", "$KV.", "$SYS.", "$OBJ.", "_INBOX."];

/// Whether `c` survives sanitization unchanged (`[A-Za-z0-9_-]`).
pub fn is_token_char(c: char) -> bool {
    c.is_ascii() && TOKEN_BYTES[c as usize]
}

/// [`is_token_char`] by byte, looked up: every byte of every subject a member receives is
/// tested against it.
const TOKEN_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        let b = byte as u8;
        table[byte] = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        byte += 1;
    }
    table
};

/// Maps every character outside `[A-Za-z0-9_-]` to `_` (§3). The result may be empty only if
/// the input is; [`Token::sanitize`] refuses that case.
pub fn sanitize(raw: &str) -> String {
    // Every subject a client builds sanitizes its own id and a peer's: almost always a token
    // already, copied whole.
    if raw.bytes().all(|b| TOKEN_BYTES[usize::from(b)]) {
        return raw.to_owned();
    }
    raw.chars()
        .map(|c| if is_token_char(c) { c } else { '_' })
        .collect()
}

/// One sanitized, non-empty subject token.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token(String);

impl Token {
    /// Sanitizes `raw` into a token. `slot` names the subject position for the error.
    pub fn sanitize(raw: &str, slot: TokenSlot) -> Result<Self, SubjectError> {
        if raw.is_empty() {
            return Err(SubjectError::EmptyToken { slot });
        }
        Ok(Self(sanitize(raw)))
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Which position of a subject a token fills; carried by errors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenSlot {
    /// `<space>`, token 1.
    Space,
    /// The sending instance.
    Sender,
    /// The unicast target instance (`inst`).
    Target,
    /// The anycast role (`svc`).
    Role,
    /// The control service (`ctl`).
    Service,
    /// The instance of a `trace`/`control` subject.
    Instance,
}

impl fmt::Display for TokenSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Space => "space",
            Self::Sender => "sender",
            Self::Target => "target",
            Self::Role => "role",
            Self::Service => "service",
            Self::Instance => "instance",
        })
    }
}

/// Why a subject could not be built or is refused for application use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectError {
    /// A routing token was empty before sanitization.
    #[error("the {slot} token is empty")]
    EmptyToken {
        /// The empty position.
        slot: TokenSlot,
    },
    /// The subject starts with a prefix reserved to the broker (§3).
    #[error("subject {subject:?} uses the reserved prefix {prefix:?}")]
    ReservedPrefix {
        /// The refused subject.
        subject: String,
        /// The matched reserved prefix.
        prefix: &'static str,
    },
    /// The subject is not a well-formed NATS subject (empty token or whitespace).
    #[error("subject {subject:?} is not a well-formed NATS subject")]
    NotWellFormed {
        /// The refused subject.
        subject: String,
    },
}

/// Builds the subjects of one space (§3 table). The space token is sanitized once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpaceSubjects {
    space: Token,
    prefix: String,
}

impl SpaceSubjects {
    /// Subjects for `space` (sanitized; empty is refused).
    pub fn new(space: &str) -> Result<Self, SubjectError> {
        let space = Token::sanitize(space, TokenSlot::Space)?;
        let prefix = format!("{ROOT}.{space}");
        Ok(Self { space, prefix })
    }

    /// The sanitized space token.
    pub fn space(&self) -> &Token {
        &self.space
    }

    /// `cotal.<space>`.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    fn join(&self, kind: &str, tokens: &[&str]) -> String {
        let len = tokens.iter().map(|t| t.len() + 1).sum::<usize>();
        let mut s = String::with_capacity(self.prefix.len() + 1 + kind.len() + len);
        s.push_str(&self.prefix);
        s.push('.');
        s.push_str(kind);
        for t in tokens {
            s.push('.');
            s.push_str(t);
        }
        s
    }

    /// Multicast: `cotal.<space>.chat.<sender>.<channel...>`. The channel is concrete by type.
    pub fn chat(&self, sender: &str, channel: &Channel) -> Result<String, SubjectError> {
        let sender = Token::sanitize(sender, TokenSlot::Sender)?;
        Ok(self.join("chat", &[sender.as_str(), channel.as_str()]))
    }

    /// Live-read subscription / `sub.allow` grant for a channel pattern:
    /// `cotal.<space>.chat.*.<pattern>` (any sender; wildcards preserved, §3, §9).
    pub fn chat_subscription(&self, channel: &ChannelPattern) -> String {
        self.join("chat", &["*", channel.as_str()])
    }

    /// Unicast: `cotal.<space>.inst.<target>.<sender>`.
    pub fn inst(&self, target: &str, sender: &str) -> Result<String, SubjectError> {
        let target = Token::sanitize(target, TokenSlot::Target)?;
        let sender = Token::sanitize(sender, TokenSlot::Sender)?;
        Ok(self.join("inst", &[target.as_str(), sender.as_str()]))
    }

    /// Anycast: `cotal.<space>.svc.<role>.<sender>`.
    pub fn svc(&self, role: &str, sender: &str) -> Result<String, SubjectError> {
        let role = Token::sanitize(role, TokenSlot::Role)?;
        let sender = Token::sanitize(sender, TokenSlot::Sender)?;
        Ok(self.join("svc", &[role.as_str(), sender.as_str()]))
    }

    /// Control: `cotal.<space>.ctl.<service>.<sender>`.
    pub fn ctl(&self, service: &str, sender: &str) -> Result<String, SubjectError> {
        let service = Token::sanitize(service, TokenSlot::Service)?;
        let sender = Token::sanitize(sender, TokenSlot::Sender)?;
        Ok(self.join("ctl", &[service.as_str(), sender.as_str()]))
    }

    /// Reserved trace subject: `cotal.<space>.trace.<instance>`.
    pub fn trace(&self, instance: &str) -> Result<String, SubjectError> {
        let instance = Token::sanitize(instance, TokenSlot::Instance)?;
        Ok(self.join("trace", &[instance.as_str()]))
    }

    /// Reserved control-plane subject: `cotal.<space>.control.<instance>`.
    pub fn control(&self, instance: &str) -> Result<String, SubjectError> {
        let instance = Token::sanitize(instance, TokenSlot::Instance)?;
        Ok(self.join("control", &[instance.as_str()]))
    }
}

/// Refuses subjects an application must not publish or subscribe on: the reserved prefixes of
/// §3, and strings that are not well-formed NATS subjects (empty tokens, whitespace).
pub fn check_application_subject(subject: &str) -> Result<(), SubjectError> {
    if let Some(prefix) = RESERVED_PREFIXES
        .iter()
        .find(|p| subject.starts_with(*p))
        .copied()
    {
        return Err(SubjectError::ReservedPrefix {
            subject: subject.to_owned(),
            prefix,
        });
    }
    let well_formed = !subject.is_empty()
        && subject.split('.').all(|t| !t.is_empty())
        && !subject.chars().any(char::is_whitespace);
    if !well_formed {
        return Err(SubjectError::NotWellFormed {
            subject: subject.to_owned(),
        });
    }
    Ok(())
}

/// The subject kinds that carry a sender (§3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SubjectKind {
    /// `chat`: multicast on a channel.
    Chat,
    /// `inst`: unicast to an instance.
    Inst,
    /// `svc`: anycast to a role.
    Svc,
    /// `ctl`: a control request to a service.
    Ctl,
}

impl SubjectKind {
    /// The kind token as it appears at token 2.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Inst => "inst",
            Self::Svc => "svc",
            Self::Ctl => "ctl",
        }
    }
}

impl fmt::Display for SubjectKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A subject that has a sender, as located by [`parse_subject`]. Borrows from the subject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedSubject<'a> {
    /// The subject kind (token 2).
    pub kind: SubjectKind,
    /// The space token (token 1).
    pub space: &'a str,
    /// The sender token: token 3 for `chat`, token 4 otherwise.
    pub sender: &'a str,
    /// `chat`: the channel, tokens 4+ joined by `.`; `inst`/`svc`/`ctl`: the route target,
    /// token 3 (target instance, role, or service).
    pub rest: &'a str,
}

/// Why a subject has no sender (§3: it must not be read as a delivery).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubjectParseError {
    /// Token 0 is not `cotal`.
    #[error("subject does not start with \"cotal.\"")]
    NotCotal,
    /// A token is empty (leading, trailing or doubled `.`).
    #[error("token {index} is empty")]
    EmptyToken {
        /// Zero-based token index.
        index: usize,
    },
    /// A token holds a character that sanitization would have replaced (or a wildcard).
    #[error("token {index} contains {found:?}, which is not in [A-Za-z0-9_-]")]
    InvalidToken {
        /// Zero-based token index.
        index: usize,
        /// The offending character.
        found: char,
    },
    /// Fewer than three tokens: no kind.
    #[error("subject has no kind token")]
    MissingKind,
    /// The kind is known but carries no sender (`trace`, `control`).
    #[error("{kind:?} subjects carry no sender")]
    NoSenderKind {
        /// The kind token.
        kind: String,
    },
    /// The kind token is not one this version defines.
    #[error("unknown subject kind {kind:?}")]
    UnknownKind {
        /// The kind token.
        kind: String,
    },
    /// A `chat` subject needs a sender and at least one channel token (5+ tokens).
    #[error("chat subject needs at least 5 tokens, got {tokens}")]
    ChatTooShort {
        /// Token count found.
        tokens: usize,
    },
    /// An `inst`/`svc`/`ctl` subject has exactly 5 tokens.
    #[error("{kind} subject needs exactly 5 tokens, got {tokens}")]
    WrongTokenCount {
        /// The subject kind.
        kind: SubjectKind,
        /// Token count found.
        tokens: usize,
    },
}

/// Locates kind, sender and rest of a delivery or control subject (§3).
///
/// Every token must be non-empty and in sanitized form; a subject of any other shape has no
/// sender. Every copy received is parsed here: one pass over the bytes, which records where
/// the first five tokens are and allocates nothing (a subject is ASCII as a rule; the first
/// byte outside `[A-Za-z0-9_-.]` ends the pass and names its character).
pub fn parse_subject(subject: &str) -> Result<ParsedSubject<'_>, SubjectParseError> {
    let root_dot = ROOT.len();
    if !subject.starts_with(ROOT)
        || subject.len() > root_dot && subject.as_bytes()[root_dot] != b'.'
    {
        return Err(SubjectParseError::NotCotal);
    }
    // Token 0 is the root; the bounds of tokens 1..=4 as they are found, and how many tokens.
    let mut tokens = [(0, root_dot); 5];
    let mut count = 1;
    if subject.len() > root_dot {
        let bytes = subject.as_bytes();
        let mut start = root_dot + 1;
        for at in root_dot + 1..=bytes.len() {
            match bytes.get(at) {
                None | Some(b'.') => {
                    if at == start {
                        return Err(SubjectParseError::EmptyToken { index: count });
                    }
                    if let Some(bounds) = tokens.get_mut(count) {
                        *bounds = (start, at);
                    }
                    count += 1;
                    start = at + 1;
                }
                Some(&b) if TOKEN_BYTES[usize::from(b)] => {}
                // Every byte before `at` is ASCII: `at` starts a character.
                Some(_) => {
                    let found = subject[at..].chars().next().unwrap_or_default();
                    return Err(SubjectParseError::InvalidToken {
                        index: count,
                        found,
                    });
                }
            }
        }
    }
    let token = |index: usize| &subject[tokens[index].0..tokens[index].1];
    if count < 3 {
        return Err(SubjectParseError::MissingKind);
    }
    let kind = match token(2) {
        "chat" => SubjectKind::Chat,
        "inst" => SubjectKind::Inst,
        "svc" => SubjectKind::Svc,
        "ctl" => SubjectKind::Ctl,
        kind @ ("trace" | "control") => {
            return Err(SubjectParseError::NoSenderKind {
                kind: kind.to_owned(),
            });
        }
        other => {
            return Err(SubjectParseError::UnknownKind {
                kind: other.to_owned(),
            });
        }
    };
    match kind {
        SubjectKind::Chat if count < 5 => Err(SubjectParseError::ChatTooShort { tokens: count }),
        SubjectKind::Chat => Ok(ParsedSubject {
            kind,
            space: token(1),
            sender: token(3),
            // The channel is tokens 4 and after, with their dots.
            rest: &subject[tokens[4].0..],
        }),
        SubjectKind::Inst | SubjectKind::Svc | SubjectKind::Ctl if count != 5 => {
            Err(SubjectParseError::WrongTokenCount {
                kind,
                tokens: count,
            })
        }
        SubjectKind::Inst | SubjectKind::Svc | SubjectKind::Ctl => Ok(ParsedSubject {
            kind,
            space: token(1),
            sender: token(4),
            rest: token(3),
        }),
    }
}

/// NATS subject matching: `*` matches exactly one token, a final `>` matches one or more
/// remaining tokens (so `team.>` does not match `team`). `subject` is taken literally.
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut pattern_tokens = pattern.split('.');
    let mut subject_tokens = subject.split('.');
    loop {
        match (pattern_tokens.next(), subject_tokens.next()) {
            (Some(">"), Some(_)) => return pattern_tokens.next().is_none(),
            (Some("*"), Some(_)) => {}
            (Some(p), Some(s)) if p == s => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_bytes_are_ascii_letters_digits_underscore_and_dash() {
        let token: Vec<u8> = (b'a'..=b'z')
            .chain(b'A'..=b'Z')
            .chain(b'0'..=b'9')
            .chain([b'_', b'-'])
            .collect();
        for byte in 0..=u8::MAX {
            assert_eq!(
                TOKEN_BYTES[usize::from(byte)],
                token.contains(&byte),
                "byte {byte:#04x}"
            );
        }
        assert!(!is_token_char('é') && !is_token_char('.') && is_token_char('Z'));
    }

    const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";
    const BOB: &str = "UDI36ZKVNUM5WMO4QQ6HDQU7F4OH2RCXOJRX6GAIOS5SKVNNSKCDNLJA";

    fn main() -> SpaceSubjects {
        SpaceSubjects::new("main").unwrap()
    }

    #[test]
    fn sanitize_maps_each_character_outside_the_set() {
        assert_eq!(sanitize("team backend/é😀.x*>"), "team_backend____x__");
        assert_eq!(sanitize("A-z_09"), "A-z_09");
        assert_eq!(sanitize(""), "");
    }

    #[test]
    fn empty_tokens_are_refused_by_slot() {
        assert_eq!(
            SpaceSubjects::new(""),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Space
            })
        );
        let ch = Channel::new("a").unwrap();
        assert_eq!(
            main().chat("", &ch),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Sender
            })
        );
        assert_eq!(
            main().inst("", ALICE),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Target
            })
        );
        assert_eq!(
            main().svc("", ALICE),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Role
            })
        );
        assert_eq!(
            main().ctl("", ALICE),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Service
            })
        );
        assert_eq!(
            main().trace(""),
            Err(SubjectError::EmptyToken {
                slot: TokenSlot::Instance
            })
        );
    }

    #[test]
    fn builders_produce_the_spec_table() {
        let s = main();
        let ch = Channel::new("team.backend").unwrap();
        assert_eq!(
            s.chat(ALICE, &ch).unwrap(),
            format!("cotal.main.chat.{ALICE}.team.backend")
        );
        assert_eq!(
            s.inst(BOB, ALICE).unwrap(),
            format!("cotal.main.inst.{BOB}.{ALICE}")
        );
        assert_eq!(
            s.svc("reviewer", ALICE).unwrap(),
            format!("cotal.main.svc.reviewer.{ALICE}")
        );
        assert_eq!(
            s.ctl("manager", ALICE).unwrap(),
            format!("cotal.main.ctl.manager.{ALICE}")
        );
        assert_eq!(s.trace(ALICE).unwrap(), format!("cotal.main.trace.{ALICE}"));
        assert_eq!(
            s.control(ALICE).unwrap(),
            format!("cotal.main.control.{ALICE}")
        );
        let pattern = ChannelPattern::new("team.>").unwrap();
        assert_eq!(s.chat_subscription(&pattern), "cotal.main.chat.*.team.>");
    }

    #[test]
    fn builders_sanitize_every_token() {
        let s = SpaceSubjects::new("my space").unwrap();
        assert_eq!(s.prefix(), "cotal.my_space");
        assert_eq!(s.space().as_str(), "my_space");
        assert_eq!(
            s.svc("code.review", "a*b").unwrap(),
            "cotal.my_space.svc.code_review.a_b"
        );
    }

    #[test]
    fn parse_chat_splits_sender_and_channel() {
        let subject = format!("cotal.main.chat.{ALICE}.team.backend");
        let p = parse_subject(&subject).unwrap();
        assert_eq!(p.kind, SubjectKind::Chat);
        assert_eq!(p.space, "main");
        assert_eq!(p.sender, ALICE);
        assert_eq!(p.rest, "team.backend");
    }

    #[test]
    fn parse_inst_svc_ctl_take_sender_at_token_4() {
        for (kind, target) in [
            (SubjectKind::Inst, BOB),
            (SubjectKind::Svc, "reviewer"),
            (SubjectKind::Ctl, "manager"),
        ] {
            let subject = format!("cotal.main.{kind}.{target}.{ALICE}");
            let p = parse_subject(&subject).unwrap();
            assert_eq!((p.kind, p.sender, p.rest), (kind, ALICE, target));
        }
    }

    #[test]
    fn parse_refusals_are_typed() {
        use SubjectParseError as E;
        let cases: Vec<(String, E)> = vec![
            ("".into(), E::NotCotal),
            ("nats.main.chat.a.b".into(), E::NotCotal),
            ("cotal".into(), E::MissingKind),
            ("cotal.main".into(), E::MissingKind),
            ("cotal..chat.a.b".into(), E::EmptyToken { index: 1 }),
            ("cotal.main.chat.a.b.".into(), E::EmptyToken { index: 5 }),
            (
                "cotal.main.chat.a.b*".into(),
                E::InvalidToken {
                    index: 4,
                    found: '*',
                },
            ),
            (
                "cotal.main.chat.*.b".into(),
                E::InvalidToken {
                    index: 3,
                    found: '*',
                },
            ),
            (
                "cotal.main.trace.a".into(),
                E::NoSenderKind {
                    kind: "trace".into(),
                },
            ),
            (
                "cotal.main.control.a".into(),
                E::NoSenderKind {
                    kind: "control".into(),
                },
            ),
            (
                "cotal.main.dinbox.a.b".into(),
                E::UnknownKind {
                    kind: "dinbox".into(),
                },
            ),
            (
                format!("cotal.main.chat.{ALICE}"),
                E::ChatTooShort { tokens: 4 },
            ),
            (
                "cotal.main.inst.a".into(),
                E::WrongTokenCount {
                    kind: SubjectKind::Inst,
                    tokens: 4,
                },
            ),
            (
                "cotal.main.ctl.delivery.a.reply.x".into(),
                E::WrongTokenCount {
                    kind: SubjectKind::Ctl,
                    tokens: 7,
                },
            ),
        ];
        for (subject, expected) in cases {
            assert_eq!(parse_subject(&subject), Err(expected), "{subject}");
        }
    }

    #[test]
    fn reserved_prefixes_are_refused() {
        for prefix in RESERVED_PREFIXES {
            let subject = format!("{prefix}X.Y");
            assert_eq!(
                check_application_subject(&subject),
                Err(SubjectError::ReservedPrefix {
                    subject: subject.clone(),
                    prefix
                })
            );
        }
        assert!(check_application_subject("cotal.main.chat.a.b").is_ok());
        assert!(check_application_subject("JS.API").is_ok());
    }

    #[test]
    fn malformed_application_subjects_are_refused() {
        for subject in ["", "a..b", ".a", "a.", "a b"] {
            assert_eq!(
                check_application_subject(subject),
                Err(SubjectError::NotWellFormed {
                    subject: subject.into()
                })
            );
        }
    }

    #[test]
    fn subject_matching_follows_nats() {
        assert!(subject_matches("team.>", "team.backend"));
        assert!(subject_matches("team.>", "team.backend.db"));
        assert!(!subject_matches("team.>", "team"));
        assert!(subject_matches("team.*", "team.backend"));
        assert!(!subject_matches("team.*", "team.backend.db"));
        assert!(!subject_matches("team.*", "team"));
        assert!(subject_matches(">", "a"));
        assert!(subject_matches("*.b", "a.b"));
        assert!(subject_matches("a.b", "a.b"));
        assert!(!subject_matches("a.b", "a.c"));
        assert!(!subject_matches("a.b", "a.b.c"));
        assert!(!subject_matches("a.>.c", "a.b.c"));
        assert!(subject_matches(
            "cotal.main.chat.*.team.>",
            "cotal.main.chat.U1.team.x"
        ));
    }
}
