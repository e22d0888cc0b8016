//! Runs the data files under `spec/vectors/` (spec §12 and beyond).

use serde_json::Value;

use super::spec_json;
use crate::protocol::{
    Channel, ChannelPattern, CotalMessage, JoinLink, JoinLinkError, LinkAuth, SpaceSubjects,
    SubjectParseError, accept_delivery, parse_subject,
};

fn str_of(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v}"))
}

fn subject_error_code(e: &SubjectParseError) -> &'static str {
    match e {
        SubjectParseError::NotCotal => "not-cotal",
        SubjectParseError::EmptyToken { .. } => "empty-token",
        SubjectParseError::InvalidToken { .. } => "invalid-token",
        SubjectParseError::MissingKind => "missing-kind",
        SubjectParseError::NoSenderKind { .. } => "no-sender-kind",
        SubjectParseError::UnknownKind { .. } => "unknown-kind",
        SubjectParseError::ChatTooShort { .. } => "chat-too-short",
        SubjectParseError::WrongTokenCount { .. } => "wrong-token-count",
    }
}

#[test]
fn subject_parse_vectors() {
    let doc = spec_json("vectors/subjects.json");
    let cases = doc["parse"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let subject = str_of(&case["subject"]);
        match parse_subject(subject) {
            Ok(p) => {
                assert_eq!(p.kind.as_str(), str_of(&case["kind"]), "{subject}");
                assert_eq!(p.sender, str_of(&case["sender"]), "{subject}");
                assert_eq!(p.rest, str_of(&case["rest"]), "{subject}");
            }
            Err(e) => {
                assert!(case["sender"].is_null(), "{subject}: unexpected {e}");
                assert_eq!(subject_error_code(&e), str_of(&case["error"]), "{subject}");
            }
        }
    }
}

#[test]
fn subject_build_vectors() {
    let doc = spec_json("vectors/subjects.json");
    for case in doc["build"].as_array().unwrap() {
        let s = SpaceSubjects::new(str_of(&case["space"])).unwrap();
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(str_of)
            .collect();
        let built = match str_of(&case["builder"]) {
            "chat" => s.chat(args[0], &Channel::new(args[1]).unwrap()).unwrap(),
            "chat_subscription" => s.chat_subscription(&ChannelPattern::new(args[0]).unwrap()),
            "inst" => s.inst(args[0], args[1]).unwrap(),
            "svc" => s.svc(args[0], args[1]).unwrap(),
            "ctl" => s.ctl(args[0], args[1]).unwrap(),
            "trace" => s.trace(args[0]).unwrap(),
            "control" => s.control(args[0]).unwrap(),
            other => panic!("unknown builder {other}"),
        };
        assert_eq!(built, str_of(&case["subject"]), "{case}");
    }
}

#[test]
fn message_vectors_parse_exactly_when_valid() {
    let doc = spec_json("vectors/messages.json");
    let cases = doc["messages"].as_array().unwrap();
    assert!(cases.iter().any(|c| c["valid"] == true));
    assert!(cases.iter().any(|c| c["valid"] == false));
    for case in cases {
        let parsed = CotalMessage::from_value(case["message"].clone());
        assert_eq!(
            parsed.is_ok(),
            case["valid"] == true,
            "{}: {:?}",
            case["name"],
            parsed.err()
        );
    }
}

#[test]
fn receive_vectors() {
    let doc = spec_json("vectors/receive.json");
    for case in doc["cases"].as_array().unwrap() {
        let name = &case["name"];
        let payload: Vec<u8> = if let Some(text) = case["payloadText"].as_str() {
            text.as_bytes().to_vec()
        } else if let Some(hex) = case["payloadHex"].as_str() {
            data_encoding::HEXLOWER.decode(hex.as_bytes()).unwrap()
        } else {
            serde_json::to_vec(&case["payload"]).unwrap()
        };
        let max = case["maxPayload"].as_u64().map_or(1 << 20, |m| m as usize);
        let result = accept_delivery(str_of(&case["subject"]), &payload, max);
        match (&result, case.get("accept")) {
            (Ok(d), Some(expect)) => {
                assert_eq!(d.kind.as_str(), str_of(&expect["kind"]), "{name}");
                assert_eq!(d.sender(), str_of(&expect["sender"]), "{name}");
                assert_eq!(d.route, str_of(&expect["route"]), "{name}");
            }
            (Err(e), None) => {
                assert_eq!(e.reason().as_str(), str_of(&case["reject"]), "{name}: {e}")
            }
            _ => panic!("{name}: unexpected {result:?}"),
        }
    }
}

fn link_error_code(e: &JoinLinkError) -> &'static str {
    match e {
        JoinLinkError::UnknownScheme => "unknown-scheme",
        JoinLinkError::MissingHost => "missing-host",
        JoinLinkError::InvalidHost { .. } => "invalid-host",
        JoinLinkError::InvalidPort { .. } => "invalid-port",
        JoinLinkError::MissingSpace => "missing-space",
        JoinLinkError::UnexpectedPath { .. } => "unexpected-path",
        JoinLinkError::InvalidPercentEncoding { .. } => "invalid-percent-encoding",
        JoinLinkError::EmptyCredential => "empty-credential",
    }
}

#[test]
fn link_vectors() {
    let doc = spec_json("vectors/links.json");
    for case in doc["valid"].as_array().unwrap() {
        let text = str_of(&case["link"]);
        let link: JoinLink = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(link.server_url(), str_of(&case["serverUrl"]), "{text}");
        assert_eq!(Value::Bool(link.tls_required()), case["tls"], "{text}");
        assert_eq!(link.space(), str_of(&case["space"]), "{text}");
        let channels: Vec<&str> = case["channels"]
            .as_array()
            .unwrap()
            .iter()
            .map(str_of)
            .collect();
        assert_eq!(link.channels(), channels.as_slice(), "{text}");
        let auth = &case["auth"];
        match link.auth() {
            None => assert!(auth.is_null(), "{text}"),
            Some(LinkAuth::Token(t)) => assert_eq!(t, str_of(&auth["token"]), "{text}"),
            Some(LinkAuth::UserPassword { user, password }) => {
                assert_eq!(user, str_of(&auth["user"]), "{text}");
                assert_eq!(password, str_of(&auth["password"]), "{text}");
            }
        }
        let reparsed: JoinLink = link.to_string().parse().unwrap();
        assert_eq!(reparsed, link, "{text}");
    }
    for case in doc["invalid"].as_array().unwrap() {
        let text = str_of(&case["link"]);
        let err = JoinLink::parse(text).expect_err(text);
        assert_eq!(link_error_code(&err), str_of(&case["error"]), "{text}");
    }
}
