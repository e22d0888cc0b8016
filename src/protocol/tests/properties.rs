//! Property tests: round trips, sanitization invariants, and parsers that never panic.

use proptest::prelude::*;

use super::ALICE;
use crate::protocol::subject::is_token_char;
use crate::protocol::{
    Channel, ChannelPattern, CotalMessage, Host, JoinLink, LinkAuth, ParsedSubject, Rejection,
    ReplayWindow, SpaceSubjects, SubjectKind, SubjectParseError, accept_control_request,
    accept_delivery, parse_subject, sanitize,
};

/// Any non-empty string without `.` (one raw token or segment).
fn raw_token() -> impl Strategy<Value = String> {
    "[^.]{1,12}"
}

/// A raw channel: 1..5 raw segments, none a bare wildcard.
fn raw_channel() -> impl Strategy<Value = String> {
    prop::collection::vec(
        raw_token().prop_filter("wildcard", |s| s != "*" && s != ">"),
        1..5,
    )
    .prop_map(|segments| segments.join("."))
}

/// Strings biased towards subject syntax.
fn subjectish() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just("cotal".to_owned()),
            Just("chat".to_owned()),
            Just("inst".to_owned()),
            Just("svc".to_owned()),
            Just("ctl".to_owned()),
            Just("*".to_owned()),
            Just(">".to_owned()),
            Just(String::new()),
            "[A-Za-z0-9_-]{1,8}",
            ".{0,4}",
        ],
        0..9,
    )
    .prop_map(|tokens| tokens.join("."))
}

/// §3's rules for a subject with a sender as written, token by token: the model the one pass
/// of [`parse_subject`] is held to.
fn parse_subject_as_written(subject: &str) -> Result<ParsedSubject<'_>, SubjectParseError> {
    let tokens: Vec<&str> = subject.split('.').collect();
    if tokens[0] != "cotal" {
        return Err(SubjectParseError::NotCotal);
    }
    for (index, token) in tokens.iter().enumerate() {
        if token.is_empty() {
            return Err(SubjectParseError::EmptyToken { index });
        }
        if let Some(found) = token.chars().find(|c| !is_token_char(*c)) {
            return Err(SubjectParseError::InvalidToken { index, found });
        }
    }
    let kind = match *tokens.get(2).ok_or(SubjectParseError::MissingKind)? {
        "chat" => SubjectKind::Chat,
        "inst" => SubjectKind::Inst,
        "svc" => SubjectKind::Svc,
        "ctl" => SubjectKind::Ctl,
        kind @ ("trace" | "control") => {
            return Err(SubjectParseError::NoSenderKind { kind: kind.into() });
        }
        kind => return Err(SubjectParseError::UnknownKind { kind: kind.into() }),
    };
    let (space, n) = (tokens[1], tokens.len());
    match kind {
        SubjectKind::Chat if n < 5 => Err(SubjectParseError::ChatTooShort { tokens: n }),
        SubjectKind::Chat => Ok(ParsedSubject {
            kind,
            space,
            sender: tokens[3],
            rest: &subject[tokens[..4].iter().map(|t| t.len() + 1).sum::<usize>()..],
        }),
        _ if n != 5 => Err(SubjectParseError::WrongTokenCount { kind, tokens: n }),
        _ => Ok(ParsedSubject {
            kind,
            space,
            sender: tokens[4],
            rest: tokens[3],
        }),
    }
}

proptest! {
    #[test]
    fn sanitize_is_idempotent_and_yields_only_token_chars(raw in ".*") {
        let once = sanitize(&raw);
        prop_assert_eq!(sanitize(&once), once.clone());
        prop_assert!(once.chars().all(is_token_char));
        prop_assert!(!once.contains('.') && !once.contains('*') && !once.contains('>'));
        prop_assert_eq!(once.chars().count(), raw.chars().count());
    }

    #[test]
    fn chat_subjects_round_trip(space in raw_token(), sender in raw_token(), channel in raw_channel()) {
        let s = SpaceSubjects::new(&space).unwrap();
        let channel = Channel::new(&channel).unwrap();
        let subject = s.chat(&sender, &channel).unwrap();
        let p = parse_subject(&subject).unwrap();
        prop_assert_eq!(p.kind, SubjectKind::Chat);
        prop_assert_eq!(p.space, s.space().as_str());
        prop_assert_eq!(p.sender, sanitize(&sender));
        prop_assert_eq!(p.rest, channel.as_str());
    }

    #[test]
    fn routed_subjects_round_trip(space in raw_token(), target in raw_token(), sender in raw_token(), which in 0..3usize) {
        let s = SpaceSubjects::new(&space).unwrap();
        let (subject, kind) = match which {
            0 => (s.inst(&target, &sender).unwrap(), SubjectKind::Inst),
            1 => (s.svc(&target, &sender).unwrap(), SubjectKind::Svc),
            _ => (s.ctl(&target, &sender).unwrap(), SubjectKind::Ctl),
        };
        let p = parse_subject(&subject).unwrap();
        prop_assert_eq!(p.kind, kind);
        prop_assert_eq!(p.sender, sanitize(&sender));
        prop_assert_eq!(p.rest, sanitize(&target));
    }

    #[test]
    fn channels_are_canonical_after_sanitization(raw in raw_channel()) {
        let channel = Channel::new(&raw).unwrap();
        prop_assert_eq!(Channel::new(channel.as_str()).unwrap(), channel.clone());
        let policy = ChannelPattern::from_policy(channel.as_str()).unwrap();
        prop_assert_eq!(policy.as_str(), channel.as_str());
        prop_assert!(policy.matches(&channel));
        prop_assert_eq!(channel.as_str().split('.').count(), raw.split('.').count());
    }

    #[test]
    fn covers_implies_matches(
        p in "[ab*]{1}(\\.[ab*]){0,3}(\\.>)?",
        q in "[ab*]{1}(\\.[ab*]){0,3}(\\.>)?",
        c in "[ab]{1}(\\.[ab]){0,4}",
    ) {
        let (p, q) = (ChannelPattern::new(&p).unwrap(), ChannelPattern::new(&q).unwrap());
        let c = Channel::new(&c).unwrap();
        if p.covers(&q) && q.matches(&c) {
            prop_assert!(p.matches(&c), "{} covers {} which matches {}", p, q, c);
        }
        prop_assert!(p.covers(&p));
    }

    #[test]
    fn parse_subject_never_panics(subject in ".*") {
        let _ = parse_subject(&subject);
    }

    #[test]
    fn parse_subject_follows_the_rules_as_written(
        subject in prop_oneof![subjectish(), ".*", "cotal[.a-z$é>*]{0,24}"],
    ) {
        prop_assert_eq!(parse_subject(&subject), parse_subject_as_written(&subject));
    }

    #[test]
    fn parse_subject_never_panics_on_subjectish(subject in subjectish()) {
        if let Ok(p) = parse_subject(&subject) {
            prop_assert!(p.sender.chars().all(is_token_char));
            prop_assert!(!p.rest.is_empty());
        }
    }

    #[test]
    fn channel_constructors_never_panic(raw in ".*") {
        let _ = Channel::new(&raw);
        let _ = ChannelPattern::new(&raw);
        let _ = ChannelPattern::from_policy(&raw);
        let _ = ReplayWindow::parse(&raw);
    }

    #[test]
    fn envelope_parsers_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256), subject in subjectish()) {
        let _ = CotalMessage::from_json(&bytes);
        let _ = accept_delivery(&subject, &bytes, 1 << 20);
        let _ = accept_control_request(&subject, &bytes, 1 << 20);
    }

    #[test]
    fn envelope_parser_never_panics_on_jsonish(text in r#"[{}\[\]":,a-z0-9 ]{0,80}"#) {
        let _ = CotalMessage::from_json(text.as_bytes());
    }

    #[test]
    fn link_parser_never_panics(link in ".*", tail in "[a-z0-9@:/?&=,%\\[\\]+#.]{0,40}") {
        let _ = JoinLink::parse(&link);
        let _ = JoinLink::parse(&format!("cotal://{tail}"));
        let _ = JoinLink::parse(&format!("cotals://{tail}"));
    }

    #[test]
    fn links_round_trip(
        tls in any::<bool>(),
        host in prop_oneof![
            "[a-z][a-z0-9.-]{0,15}".prop_map(|h| h),
            any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
            any::<[u16; 8]>().prop_map(|s| format!("[{}]", std::net::Ipv6Addr::from(s))),
        ],
        port in prop::option::of(1u16..),
        space in ".{1,12}",
        auth in prop::option::of(prop_oneof![
            ".{1,10}".prop_map(LinkAuth::Token),
            (".{1,10}", ".{0,10}").prop_map(|(user, password)| LinkAuth::UserPassword { user, password }),
        ]),
        channels in prop::collection::vec(".{0,10}", 0..4),
    ) {
        let mut link = JoinLink::new(tls, Host::parse(&host).unwrap(), space).unwrap()
            .with_channels(channels);
        if let Some(port) = port {
            link = link.with_port(port).unwrap();
        }
        if let Some(auth) = auth {
            link = link.with_auth(auth).unwrap();
        }
        let text = link.to_string();
        let reparsed: JoinLink = text.parse().unwrap();
        prop_assert_eq!(&reparsed, &link, "{}", text);
        prop_assert!(!link.server_url().contains('@'));
    }
}

/// A JSON value of any type, small, as text.
fn any_json() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("7".to_owned()),
        Just("-1.5e3".to_owned()),
        Just("[]".to_owned()),
        Just("{}".to_owned()),
        Just(r#"["a", 1, {"b": null}]"#.to_owned()),
        "[a-z ]{0,4}".prop_map(|s| format!("{s:?}")),
    ]
}

/// A value for envelope key `key`: usually of the type the schema asks for, sometimes any.
fn value_for(key: &'static str) -> BoxedStrategy<String> {
    let typed: BoxedStrategy<String> = match key {
        "ts" => Just("1700000000000".to_owned()).boxed(),
        "from" => prop::collection::vec(
            (
                prop::sample::select(vec!["id", "name", "role", "x-extra", "\\u0069d"]),
                prop_oneof![Just(format!("{:?}", ALICE)), any_json()],
            ),
            0..5,
        )
        .prop_map(|fields| object(&fields))
        .boxed(),
        "mentions" => Just(r#"["bob", "carol"]"#.to_owned()).boxed(),
        "parts" => prop::collection::vec(
            prop_oneof![
                Just(r#"{"kind": "text", "text": "hi"}"#.to_owned()),
                Just(r#"{"kind": "data", "data": null, "n": 1}"#.to_owned()),
                Just(r#"{"kind": "com.acme.x", "text": 5}"#.to_owned()),
                Just(r#"{"kind": "image"}"#.to_owned()),
                any_json(),
            ],
            0..3,
        )
        .prop_map(|parts| format!("[{}]", parts.join(",")))
        .boxed(),
        _ => "[a-z]{1,4}".prop_map(|s| format!("{s:?}")).boxed(),
    };
    prop_oneof![4 => typed, 1 => any_json()].boxed()
}

/// A JSON object of `fields` (keys written as given, so a key may repeat or hold an escape).
fn object(fields: &[(&str, String)]) -> String {
    let entries: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("\"{k}\": {v}"))
        .collect();
    format!("{{{}}}", entries.join(", "))
}

/// Envelope documents: a valid message's fields, each kept most of the time, with known and
/// unknown keys added before or after them (a key may repeat: the last one counts), values of
/// the right type or any; sometimes cut short, or not an object.
fn envelope_text() -> impl Strategy<Value = String> {
    let valid = [
        ("id", "\"m1\"".to_owned()),
        ("ts", "1".to_owned()),
        ("space", "\"main\"".to_owned()),
        ("from", format!(r#"{{"id": "{ALICE}", "name": "alice"}}"#)),
        ("channel", "\"general\"".to_owned()),
        ("parts", r#"[{"kind": "text", "text": "hi"}]"#.to_owned()),
    ];
    let keys = vec![
        "id",
        "ts",
        "space",
        "from",
        "channel",
        "to",
        "toService",
        "mentions",
        "parts",
        "replyTo",
        "contextId",
        "extra",
        "\\u0069d",
    ];
    let added = prop::collection::vec(
        prop::sample::select(keys).prop_flat_map(|k| (Just(k), value_for(k))),
        0..5,
    );
    let document = (
        prop::collection::vec(prop::bool::weighted(0.9), valid.len()),
        added,
        any::<bool>(),
    )
        .prop_map(move |(kept, added, added_first)| {
            let base = valid
                .iter()
                .zip(kept)
                .filter(|(_, k)| *k)
                .map(|(f, _)| f.clone());
            let fields: Vec<(&str, String)> = match added_first {
                true => added.into_iter().chain(base).collect(),
                false => base.chain(added).collect(),
            };
            object(&fields)
        });
    prop_oneof![
        6 => document.clone(),
        1 => (document, any::<prop::sample::Index>())
            .prop_map(|(text, cut)| text[..cut.index(text.len() + 1)].to_owned()),
        1 => any_json(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// A delivery read in one pass is judged exactly as its decoded document is: accepted as the
    /// same message, or refused for the same reason with the same detail.
    #[test]
    fn one_pass_read_judges_as_the_decoded_document(text in envelope_text()) {
        let subject = format!("cotal.main.chat.{ALICE}.general");
        let decoded = serde_json::from_str::<serde_json::Value>(&text)
            .map_err(|e| e.to_string())
            .and_then(|value| {
                let from_id = value.get("from").and_then(|f| f.get("id")).and_then(|i| i.as_str());
                match from_id {
                    None => Err(Rejection::MissingSender.to_string()),
                    Some(id) if id != ALICE => Err(Rejection::SenderMismatch {
                        subject_sender: ALICE.to_owned(),
                        from_id: id.to_owned(),
                    }.to_string()),
                    Some(_) => CotalMessage::from_value(value)
                        .map_err(|e| Rejection::InvalidEnvelope(e).to_string()),
                }
            });
        let read = accept_delivery(&subject, text.as_bytes(), 1 << 20)
            .map(|accepted| accepted.message)
            .map_err(|r| match r {
                Rejection::MalformedJson(e) => e.to_string(),
                other => other.to_string(),
            });
        prop_assert_eq!(read, decoded, "{}", text);
    }
}
