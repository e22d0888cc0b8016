//! Property tests: round trips, sanitization invariants, and parsers that never panic.

use proptest::prelude::*;

use crate::protocol::subject::is_token_char;
use crate::protocol::{
    Channel, ChannelPattern, CotalMessage, Host, JoinLink, LinkAuth, ReplayWindow, SpaceSubjects,
    SubjectKind, accept_control_request, accept_delivery, parse_subject, sanitize,
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
