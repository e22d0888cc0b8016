//! Subject parsing (§3) and channel-name constructors. Oracles: a parsed subject rebuilds to
//! itself through the builders; a strict policy entry is never rewritten.
#![no_main]

use cotald::protocol::{Channel, ChannelPattern, SpaceSubjects, SubjectKind, parse_subject};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(p) = parse_subject(text) {
        let subjects = SpaceSubjects::new(p.space).expect("parsed space is a token");
        let rebuilt = match p.kind {
            SubjectKind::Chat => {
                let channel = Channel::new(p.rest).expect("parsed channel is concrete");
                subjects.chat(p.sender, &channel)
            }
            SubjectKind::Inst => subjects.inst(p.rest, p.sender),
            SubjectKind::Svc => subjects.svc(p.rest, p.sender),
            SubjectKind::Ctl => subjects.ctl(p.rest, p.sender),
        }
        .expect("parsed tokens are non-empty");
        assert_eq!(rebuilt, text);
    }
    if let Ok(policy) = ChannelPattern::from_policy(text) {
        assert_eq!(policy.as_str(), text);
    }
    if let Ok(channel) = Channel::new(text) {
        assert_eq!(Channel::new(channel.as_str()).as_ref(), Ok(&channel));
        assert!(channel.to_pattern().matches(&channel));
    }
    let _ = ChannelPattern::new(text);
});
