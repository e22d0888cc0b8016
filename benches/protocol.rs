//! Receive-path cost: subject parse + size/UTF-8/JSON/sender checks + envelope parse for a
//! typical ~300-byte channel message (§4, §5), plus the send-side build + serialize.

use std::hint::black_box;

use cotald::protocol::{
    Channel, CotalMessage, EndpointRef, InstanceId, Part, Routing, SpaceSubjects, accept_delivery,
};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const ALICE: &str = "UAQGWOEVJKMIO4WXSYOTLARXYOZTCXFK67JASEH6AFFFYK6FOPSKQCAD";

fn typical_message() -> (String, Vec<u8>) {
    let alice = InstanceId::from_user_nkey(ALICE).expect("sample id");
    let channel = Channel::new("team.backend").expect("channel");
    let subject = SpaceSubjects::new("main")
        .and_then(|s| s.chat(alice.as_str(), &channel))
        .expect("subject");
    let message = CotalMessage::new(
        "main",
        EndpointRef::new(&alice, "alice").with_role("planner"),
        Routing::channel(&channel),
        vec![Part::text("Can you review the retry logic before we ship?")],
    )
    .with_mentions(["bob"])
    .with_context_id("ctx-1");
    (subject, message.to_json().expect("serialize"))
}

fn receive(c: &mut Criterion) {
    let (subject, payload) = typical_message();
    let mut group = c.benchmark_group("receive");
    group.throughput(Throughput::Bytes(payload.len() as u64));
    group.bench_function(format!("accept_delivery/{}B", payload.len()), |b| {
        b.iter(|| accept_delivery(black_box(&subject), black_box(&payload), 1 << 20))
    });
    group.finish();
}

fn send(c: &mut Criterion) {
    let alice = InstanceId::from_user_nkey(ALICE).expect("sample id");
    let channel = Channel::new("team.backend").expect("channel");
    c.bench_function("send/build+serialize", |b| {
        b.iter(|| {
            CotalMessage::new(
                "main",
                EndpointRef::new(&alice, "alice"),
                Routing::channel(&channel),
                vec![Part::text(black_box("Can you review this?"))],
            )
            .with_mentions(["bob"])
            .to_json()
        })
    });
}

criterion_group!(benches, receive, send);
criterion_main!(benches);
