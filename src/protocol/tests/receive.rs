use serde_json::json;

use super::{ALICE, BOB, alice};
use crate::protocol::{
    ControlRequest, DeliveryKind, EndpointRef, RejectReason, Rejection, SubjectKind,
    SubjectParseError, accept_control_request, accept_delivery,
};

const MAX: usize = 1 << 20;

fn unicast() -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": "m1", "ts": 1, "space": "main",
        "from": {"id": ALICE, "name": "alice"},
        "to": BOB, "parts": [{"kind": "text", "text": "hi"}]
    }))
    .unwrap()
}

#[test]
fn accepted_delivery_carries_subject_facts() {
    let d = accept_delivery(&format!("cotal.main.inst.{BOB}.{ALICE}"), &unicast(), MAX).unwrap();
    assert_eq!(d.kind, DeliveryKind::Dm);
    assert_eq!(d.sender(), ALICE);
    assert_eq!(d.route, BOB);
    assert_eq!(d.message.id, "m1");
}

#[test]
fn delivery_kind_mapping() {
    assert_eq!(
        DeliveryKind::of(SubjectKind::Chat),
        Some(DeliveryKind::Channel)
    );
    assert_eq!(DeliveryKind::of(SubjectKind::Inst), Some(DeliveryKind::Dm));
    assert_eq!(
        DeliveryKind::of(SubjectKind::Svc),
        Some(DeliveryKind::Anycast)
    );
    assert_eq!(DeliveryKind::of(SubjectKind::Ctl), None);
    assert_eq!(DeliveryKind::Channel.as_str(), "channel");
    assert_eq!(DeliveryKind::Dm.to_string(), "dm");
    assert_eq!(DeliveryKind::Anycast.as_str(), "anycast");
}

#[test]
fn oversize_is_checked_first_and_reports_sizes() {
    let payload = unicast();
    let err = accept_delivery("not a subject", &payload, 10).unwrap_err();
    assert!(matches!(err, Rejection::PayloadTooLarge { size, max: 10 } if size == payload.len()));
    assert_eq!(err.reason(), RejectReason::PayloadTooLarge);
    assert_eq!(err.reason().as_str(), "payload-too-large");
    assert!(
        accept_delivery(
            &format!("cotal.main.inst.{BOB}.{ALICE}"),
            &payload,
            payload.len()
        )
        .is_ok()
    );
}

#[test]
fn invalid_utf8_reports_position() {
    let err =
        accept_delivery(&format!("cotal.main.inst.{BOB}.{ALICE}"), b"{\"a\xff", MAX).unwrap_err();
    assert!(matches!(err, Rejection::InvalidUtf8 { valid_up_to: 3 }));
    assert_eq!(err.reason().as_str(), "malformed-json");
}

#[test]
fn malformed_subject_keeps_the_parse_error() {
    let err = accept_delivery(&format!("cotal.main.chat.{ALICE}"), &unicast(), MAX).unwrap_err();
    assert!(matches!(
        err,
        Rejection::MalformedSubject(SubjectParseError::ChatTooShort { tokens: 4 })
    ));
    assert_eq!(err.reason().as_str(), "malformed-subject");
}

#[test]
fn sender_mismatch_names_both_ids() {
    let err =
        accept_delivery(&format!("cotal.main.inst.{ALICE}.{BOB}"), &unicast(), MAX).unwrap_err();
    assert!(matches!(
        &err,
        Rejection::SenderMismatch { subject_sender, from_id }
            if subject_sender == BOB && from_id == ALICE
    ));
    assert_eq!(err.reason().as_str(), "sender-mismatch");
}

#[test]
fn missing_from_is_a_sender_mismatch() {
    let err = accept_delivery(
        &format!("cotal.main.inst.{BOB}.{ALICE}"),
        br#"{"id":"x","ts":1,"space":"main","to":"b","parts":[]}"#,
        MAX,
    )
    .unwrap_err();
    assert!(matches!(err, Rejection::MissingSender));
    assert_eq!(err.reason(), RejectReason::SenderMismatch);
}

#[test]
fn valid_json_with_bad_shape_is_malformed_json() {
    let payload = serde_json::to_vec(&json!({"from": {"id": ALICE, "name": "a"}})).unwrap();
    let err =
        accept_delivery(&format!("cotal.main.inst.{BOB}.{ALICE}"), &payload, MAX).unwrap_err();
    assert!(matches!(err, Rejection::InvalidEnvelope(_)));
    assert_eq!(err.reason(), RejectReason::MalformedJson);
}

#[test]
fn control_request_is_checked_against_the_ctl_sender() {
    let req = ControlRequest::new("status", EndpointRef::new(&alice(), "alice"));
    let payload = serde_json::to_vec(&req).unwrap();
    let ok =
        accept_control_request(&format!("cotal.main.ctl.manager.{ALICE}"), &payload, MAX).unwrap();
    assert_eq!(ok.service, "manager");
    assert_eq!(ok.sender, ALICE);
    assert_eq!(ok.request, req);

    let spoof = accept_control_request(&format!("cotal.main.ctl.manager.{BOB}"), &payload, MAX)
        .unwrap_err();
    assert_eq!(spoof.reason(), RejectReason::SenderMismatch);

    let wrong = accept_control_request(&format!("cotal.main.inst.{BOB}.{ALICE}"), &payload, MAX)
        .unwrap_err();
    assert!(matches!(
        wrong,
        Rejection::WrongSubjectKind {
            found: SubjectKind::Inst
        }
    ));
    assert_eq!(wrong.reason(), RejectReason::MalformedSubject);

    let no_op = serde_json::to_vec(&json!({"from": {"id": ALICE, "name": "a"}})).unwrap();
    let bad = accept_control_request(&format!("cotal.main.ctl.manager.{ALICE}"), &no_op, MAX)
        .unwrap_err();
    assert_eq!(bad.reason(), RejectReason::MalformedJson);

    let big = accept_control_request(&format!("cotal.main.ctl.manager.{ALICE}"), &payload, 3)
        .unwrap_err();
    assert_eq!(big.reason(), RejectReason::PayloadTooLarge);
}

#[test]
fn delivery_path_refuses_ctl_subjects() {
    let err =
        accept_delivery(&format!("cotal.main.ctl.manager.{ALICE}"), &unicast(), MAX).unwrap_err();
    assert!(matches!(
        err,
        Rejection::WrongSubjectKind {
            found: SubjectKind::Ctl
        }
    ));
}
